"""A scripted bigram model: a tiny real Llama checkpoint whose greedy reply to any chat
prompt is a text chosen by the test, so that tests can check what barellm makes of a reply
(tool calls, say) end to end with nothing in barellm faked.

Construction:
- Tokenizer: SmolLM2's byte-level BPE tokenizer.json (../shared/tokenizers/smollm2-135m)
  with added tokens appended after its 49152 ids: one non-special added token per reply
  chunk, so that each chunk is a single id, and a special one per extra special token
  string asked for (Llama 3's <|eot_id|>, say). Strings the tokenizer already holds as added
  tokens or vocabulary entries keep their ids.
- Chain: t0, the last token of the text the chat template's generation prompt ends with,
  then one token per reply chunk, then the end token. Every chain token is distinct.
- Model: LlamaForCausalLM with one layer whose o_proj and down_proj are zero, so the layer
  adds nothing to the residual stream and the hidden state at a position is the embedding
  of its token, whatever came before. Chain token number i embeds as the basis vector e_i;
  the other tokens embed as small random vectors. The norms are all ones, so the final
  RMSNorm turns e_i into sqrt(hidden_size) * e_i. lm_head is zero except that the row of
  the successor of chain token i is LOGIT_SCALE * e_i: at chain token i the successor's
  logit is LOGIT_SCALE * sqrt(hidden_size) = 80 and every other logit is 0, so greedy
  decoding from t0 writes the chunks in order and then the end token (an eos id).
"""

import json
import os

import numpy as np
from tokenizers import Tokenizer

from convert_testlib import SMOLLM2_TOKENIZER, write_safetensors

HIDDEN_SIZE = 64  # also the longest chain: each chain token takes one basis direction
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
INTERMEDIATE_SIZE = 96
LOGIT_SCALE = 10.0
RANDOM_SCALE = 0.02  # the spread of the random weights and of non-chain embeddings


def write_scripted_checkpoint(out_dir, chat_template, generation_prompt_end, reply_chunks,
                              end_token, special_tokens=(), bos_token=None, eos_token=None):
    """Write a Hugging Face Llama checkpoint (config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json) to `out_dir` whose greedy reply after a prompt ending in
    `generation_prompt_end` is the `reply_chunks` concatenated, then `end_token`; return
    `out_dir`.

    chat_template: the Jinja chat template of tokenizer_config.json.
    generation_prompt_end: the text the template's generation prompt ends with, such as
        "<|im_start|>assistant\\n"; its last token starts the chain.
    reply_chunks: the reply, in pieces; each becomes one token (an added token).
    end_token: the single token that ends the reply, such as "<|im_end|>"; config.json's
        first eos id.
    special_tokens: special token strings to add to the tokenizer, such as "<|eot_id|>".
    bos_token: tokenizer_config.json's bos_token (its id is config.json's bos_token_id);
        None for none (bos_token_id is then SmolLM2's).
    eos_token: tokenizer_config.json's eos_token, `end_token` when None; config.json's eos
        ids are those of `end_token` and `eos_token`.
    """
    with open(os.path.join(SMOLLM2_TOKENIZER, "tokenizer.json"), encoding="utf-8") as f:
        tokenizer_json = json.load(f)
    for text in special_tokens:
        _add_token(tokenizer_json, text, special=True)
    for text in reply_chunks:
        _add_token(tokenizer_json, text, special=False)
    tokenizer = Tokenizer.from_str(json.dumps(tokenizer_json))
    chain = _chain(tokenizer, generation_prompt_end, reply_chunks, end_token)
    eos_token = end_token if eos_token is None else eos_token
    eos_ids = list(dict.fromkeys([chain[-1], _single_id(tokenizer, eos_token, "eos_token")]))
    if bos_token is None:
        with open(os.path.join(SMOLLM2_TOKENIZER, "config.json"), encoding="utf-8") as f:
            bos_id = json.load(f)["bos_token_id"]
    else:
        bos_id = _single_id(tokenizer, bos_token, "bos_token")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN_SIZE, "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "vocab_size": _next_id(tokenizer_json),
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": bos_id,
        "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        "torch_dtype": "float32",
    }
    tokenizer_config = {"chat_template": chat_template, "eos_token": eos_token}
    if bos_token is not None:
        tokenizer_config["bos_token"] = bos_token
    os.makedirs(out_dir, exist_ok=True)
    for name, content in (("config.json", config), ("tokenizer.json", tokenizer_json),
                          ("tokenizer_config.json", tokenizer_config)):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(content, f, ensure_ascii=False)
    write_safetensors(os.path.join(out_dir, "model.safetensors"),
                      _tensors(config["vocab_size"], chain))
    return out_dir


def _next_id(tokenizer_json):
    """The first id after the vocabulary and the added tokens of `tokenizer_json`."""
    ids = list(tokenizer_json["model"]["vocab"].values())
    ids += [entry["id"] for entry in tokenizer_json["added_tokens"]]
    return max(ids) + 1


def _add_token(tokenizer_json, content, special):
    """Append `content` to the added tokens of `tokenizer_json`, with its vocabulary id if it
    has one (as Hugging Face tokenizers gives it), else the next free id; nothing when it
    is an added token already."""
    if any(entry["content"] == content for entry in tokenizer_json["added_tokens"]):
        return
    token_id = tokenizer_json["model"]["vocab"].get(content, _next_id(tokenizer_json))
    tokenizer_json["added_tokens"].append({
        "id": token_id, "content": content, "single_word": False, "lstrip": False,
        "rstrip": False, "normalized": False, "special": special})


def _single_id(tokenizer, text, what):
    """The id of `text`, which must encode as one token that decodes back to `text`."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert len(ids) == 1, f"{what} {text!r} encodes as {len(ids)} tokens {ids}, not one"
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    assert decoded == text, f"{what} {text!r} decodes as {decoded!r}"
    return ids[0]


def _chain(tokenizer, generation_prompt_end, reply_chunks, end_token):
    """The chain of ids: the last token of the generation prompt, the chunks, the end."""
    prompt_ids = tokenizer.encode(generation_prompt_end, add_special_tokens=False).ids
    assert prompt_ids, "generation_prompt_end is empty"
    texts = [generation_prompt_end, *reply_chunks, end_token]
    chain = [prompt_ids[-1]]
    chain += [_single_id(tokenizer, text, "reply chunk") for text in reply_chunks]
    chain.append(_single_id(tokenizer, end_token, "end_token"))
    repeated = [text for text, token_id in zip(texts, chain) if chain.count(token_id) > 1]
    assert not repeated, (f"the chain tokens must be distinct, but these share ids "
                          f"(for generation_prompt_end, its last token): {repeated}")
    assert len(chain) <= HIDDEN_SIZE, (f"a chain of {len(chain)} tokens is longer than "
                                       f"hidden_size {HIDDEN_SIZE}")
    return chain


def _tensors(vocab_size, chain):
    """The F32 weights, with Hugging Face Llama names, of the model that maps chain token
    i to chain token i + 1 (see the module docstring)."""
    rng = np.random.default_rng(0)

    def random(rows, cols):
        return ("F32", (RANDOM_SCALE * rng.standard_normal((rows, cols))).astype("<f4"))

    def zeros(rows, cols):
        return ("F32", np.zeros((rows, cols), "<f4"))

    def ones():
        return ("F32", np.ones(HIDDEN_SIZE, "<f4"))

    embedding = random(vocab_size, HIDDEN_SIZE)[1]
    lm_head = np.zeros((vocab_size, HIDDEN_SIZE), "<f4")
    for i, token_id in enumerate(chain):
        embedding[token_id] = np.eye(HIDDEN_SIZE, dtype="<f4")[i]
    for i, successor in enumerate(chain[1:]):
        lm_head[successor, i] = LOGIT_SCALE
    layer = "model.layers.0."
    return {
        "model.embed_tokens.weight": ("F32", embedding),
        layer + "input_layernorm.weight": ones(),
        layer + "self_attn.q_proj.weight": random(HEADS * HEAD_DIM, HIDDEN_SIZE),
        layer + "self_attn.k_proj.weight": random(KV_HEADS * HEAD_DIM, HIDDEN_SIZE),
        layer + "self_attn.v_proj.weight": random(KV_HEADS * HEAD_DIM, HIDDEN_SIZE),
        layer + "self_attn.o_proj.weight": zeros(HIDDEN_SIZE, HEADS * HEAD_DIM),
        layer + "post_attention_layernorm.weight": ones(),
        layer + "mlp.gate_proj.weight": random(INTERMEDIATE_SIZE, HIDDEN_SIZE),
        layer + "mlp.up_proj.weight": random(INTERMEDIATE_SIZE, HIDDEN_SIZE),
        layer + "mlp.down_proj.weight": zeros(HIDDEN_SIZE, INTERMEDIATE_SIZE),
        "model.norm.weight": ones(),
        "lm_head.weight": ("F32", lm_head),
    }
