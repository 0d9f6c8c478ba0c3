"""Writes a tiny random-weight Llama model directory for vLLM's `--load-format dummy`: config.json and a real
32,000-token tokenizer (Mistral-7B-v0.1's SentencePiece model, shipped inside the mistral_common wheel) converted
to tokenizer.json, with a plain Jinja chat template. Usage: make_model.py DIR"""
import json
import os
import shutil
import sys
import tempfile

import mistral_common
from transformers import LlamaTokenizerFast

# Content is rendered as a string (vLLM flattens text parts with "\n" for such templates).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def main(out):
    os.makedirs(out, exist_ok=True)
    sp = os.path.join(os.path.dirname(mistral_common.__file__), "data", "tokenizer.model.v1")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(sp, os.path.join(tmp, "tokenizer.model"))
        tok = LlamaTokenizerFast.from_pretrained(tmp, legacy=False)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=1)
    # The chat template also goes in tokenizer_config.json (older transformers read it only there).
    path = os.path.join(out, "tokenizer_config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["chat_template"] = CHAT_TEMPLATE
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
