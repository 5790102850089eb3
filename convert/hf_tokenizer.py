"""Loading a checkpoint's tokenizer as a Hugging Face tokenizer.json and checking that its
model and component types are ones barellm's tokenizer implements."""

import os

from common import ConvertError, read_json, read_text
import spm

# component key of tokenizer.json -> (key holding a Sequence's children, supported types)
SUPPORTED = {
    "normalizer": ("normalizers", {"Sequence", "Prepend", "Replace", "NFC"}),
    "pre_tokenizer": ("pretokenizers",
                      {"Sequence", "ByteLevel", "Split", "Digits", "Metaspace"}),
    "decoder": ("decoders",
                {"Sequence", "Replace", "ByteFallback", "Fuse", "Strip", "ByteLevel",
                 "Metaspace"}),
}

# A chat template in a file of its own beside tokenizer_config.json: the file transformers
# saves a single template to (openai/gpt-oss-20b's is there).
CHAT_TEMPLATE_FILE = "chat_template.jinja"

LLAMA_TOKENIZER_CLASSES = {"LlamaTokenizer", "LlamaTokenizerFast",
                           "CodeLlamaTokenizer", "CodeLlamaTokenizerFast"}


def load_tokenizer(hf_dir):
    """Return (tokenizer.json dict, from_sentencepiece) for the checkpoint in `hf_dir`.

    tokenizer.json is used as is when present; otherwise tokenizer.model is converted.
    """
    json_path = os.path.join(hf_dir, "tokenizer.json")
    model_path = os.path.join(hf_dir, "tokenizer.model")
    if os.path.exists(json_path):
        tokenizer = read_json(json_path)
        if not isinstance(tokenizer, dict):
            raise ConvertError("tokenizer.json: not a JSON object")
        return tokenizer, False
    if os.path.exists(model_path):
        try:
            with open(model_path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ConvertError(f"tokenizer.model: cannot read ({e.strerror})") from None
        return spm.tokenizer_json(spm.parse_model(data)), True
    raise ConvertError(f"{hf_dir}: no tokenizer.json or tokenizer.model")


def check_supported(tokenizer):
    """Raise ConvertError naming the first model or component type of tokenizer.json that
    barellm cannot run, before any weight is converted.

    The settings of the components, the regexes of Split pre-tokenizers among them, are
    left to barellm itself (src/tokenizer/load.cpp), which loads the converted file
    before it is put in place (barellm_check.py)."""
    model = tokenizer.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("vocab"), dict):
        raise ConvertError("tokenizer.json: no model vocabulary")
    if model.get("type", "BPE") != "BPE":
        raise ConvertError(f"tokenizer.json: model type '{model.get('type')}' is not supported")
    for option in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(option):
            raise ConvertError(f"tokenizer.json: BPE option {option} is not supported")
    if model.get("dropout"):
        raise ConvertError("tokenizer.json: BPE dropout is not supported")
    for key, (children, allowed) in SUPPORTED.items():
        _check_component(tokenizer.get(key), key, children, allowed)


def _check_component(node, key, children, allowed):
    """Check one normalizer/pre_tokenizer/decoder tree against the supported types."""
    if node is None:
        return
    kind = node.get("type") if isinstance(node, dict) else None
    if kind not in allowed:
        raise ConvertError(f"tokenizer.json: {key} type '{kind}' is not supported")
    if kind == "Sequence":
        for child in node.get(children) or []:
            _check_component(child, key, children, allowed)


def vocab_size(tokenizer):
    """Number of ids the tokenizer can produce: the largest id plus one."""
    ids = list(tokenizer["model"]["vocab"].values())
    ids += [t["id"] for t in tokenizer.get("added_tokens") or []]
    return max(ids) + 1


def add_bos(tokenizer_config, tokenizer, from_sentencepiece):
    """Whether encoding a prompt starts with BOS, as transformers would do it.

    `add_bos_token` of tokenizer_config.json decides when present. Otherwise BOS is
    added by Llama tokenizer classes (whose add_bos_token defaults to true), by a
    tokenizer converted from tokenizer.model (it is a Llama tokenizer), and by a
    post-processor whose single-sequence template starts with a special token.
    """
    config = tokenizer_config or {}
    if "add_bos_token" in config:
        return bool(config["add_bos_token"])
    if from_sentencepiece or config.get("tokenizer_class") in LLAMA_TOKENIZER_CLASSES:
        return True
    return _template_starts_with_special(tokenizer.get("post_processor"))


def bos_id(hf_dir, tokenizer_config, tokenizer):
    """The BOS id the tokenizer itself names, for a config.json without bos_token_id:
    the id of tokenizer_config.json's `bos_token` in tokenizer.json, else the bos_id of
    tokenizer.model's trainer spec; None when neither names one."""
    token = (tokenizer_config or {}).get("bos_token")
    if isinstance(token, dict):
        token = token.get("content")
    if isinstance(token, str):
        ids = {entry.get("content"): entry.get("id")
               for entry in tokenizer.get("added_tokens") or [] if isinstance(entry, dict)}
        found = ids.get(token, tokenizer["model"]["vocab"].get(token))
        if isinstance(found, int):
            return found
    model_path = os.path.join(hf_dir, "tokenizer.model")
    if os.path.exists(model_path):
        try:
            with open(model_path, "rb") as f:
                model = spm.parse_model(f.read())
        except OSError as e:
            raise ConvertError(f"tokenizer.model: cannot read ({e.strerror})") from None
        if model["bos_id"] is not None and model["bos_id"] < len(model["pieces"]):
            return model["bos_id"]
    return None


def _template_starts_with_special(processor):
    """True when a (possibly nested) TemplateProcessing puts a special token first."""
    if not isinstance(processor, dict):
        return False
    if processor.get("type") == "Sequence":
        return any(_template_starts_with_special(p) for p in processor.get("processors", []))
    if processor.get("type") == "TemplateProcessing":
        single = processor.get("single") or []
        return bool(single) and "SpecialToken" in single[0]
    return False


def chat_template(hf_dir, tokenizer_config):
    """The checkpoint's chat template, verbatim, or None when it has none: the file
    chat_template.jinja where there is one (it takes the place of tokenizer_config.json's, as
    transformers reads them), else the `chat_template` of tokenizer_config.json, a string or
    a list of {"name", "template"} of which the one named "default" is taken (None when no
    entry is named so).
    """
    template_file = read_text(os.path.join(hf_dir, CHAT_TEMPLATE_FILE), required=False)
    if template_file is not None:
        return template_file
    template = (tokenizer_config or {}).get("chat_template")
    if isinstance(template, list):
        template = next((entry.get("template") for entry in template
                         if isinstance(entry, dict) and entry.get("name") == "default"), None)
    if template is None:
        return None
    if not isinstance(template, str):
        raise ConvertError("tokenizer_config.json: chat_template is not a string or a "
                           "list of {name, template}")
    return template
