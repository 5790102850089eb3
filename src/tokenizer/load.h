// Reading tokenizer.json into the components that encode and decode with it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decode.h"
#include "tokenizer/normalize.h"
#include "tokenizer/pretokenize.h"

namespace barellm::tok {

// What a tokenizer.json describes, built.
struct Components {
    BpeModel model;
    AddedVocabulary added;
    std::unique_ptr<Normalizer> normalizer;       // null: none
    std::unique_ptr<PreTokenizer> pre_tokenizer;  // null: none
    std::vector<StageFactory> decoder;            // empty: join tokens with spaces
};

// Parses a tokenizer.json document. Throws Error naming any unsupported feature, and any
// id (of the vocabulary, or given to an added token) that is not below `id_limit`.
Components load_components(const std::string& tokenizer_json, int id_limit);

}  // namespace barellm::tok
