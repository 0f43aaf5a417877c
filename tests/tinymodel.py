"""A tiny local HF model folder (ByteLevel BPE tokenizer + random-init Llama) for tests.

``build_tiny_model(dest)`` writes the folder once and reuses it while its marker file is present,
so session fixtures and repeated calls are cheap. Nothing is downloaded. ``merge_generations`` is
what an exported merge is held to: the tokens of the merged model against the base with its adapter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.tinydata import CORPUS

VOCAB_SIZE = 384
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_MARKER = ".tiny-model-v2"
ARCH = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": 1024}


def _train_tokenizer(dest: Path, chat_template: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = CORPUS + "\n<|user|>\n<|assistant|>\n<|system|>\n"
    tok.train_from_iterator([corpus] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dest)
    return fast


def _save_model(dest: Path, tokenizer, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=False, **ARCH)
    model = LlamaForCausalLM(config)
    model.save_pretrained(dest)


def build_tiny_model(dest: Path, *, chat_template: bool = True, seed: int = 0) -> Path:
    """Write (once) a loadable tiny model folder at ``dest`` and return it."""
    dest = Path(dest)
    marker = dest / _MARKER
    wanted = {"chat_template": chat_template, "seed": seed}
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(dest, chat_template)
    _save_model(dest, tokenizer, seed)
    marker.write_text(json.dumps(wanted))
    return dest


def merge_generations(merged: Path, base: Path, adapter: Path, device: str = "cpu"
                      ) -> tuple[Any, list[Any], list[Any], list[Any]]:
    """The merged model, and the greedy tokens (12 new, one prompt) of the merged model, of the bf16
    base with the adapter, and of the bf16 base alone: what an export's merge is checked against."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(merged).to(device)
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).to(device), str(adapter))
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).to(device)
    tokenizer = AutoTokenizer.from_pretrained(merged)
    prompt = tokenizer("Repeat the word: river", return_tensors="pt").to(device)
    settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        return model, *(m.generate(**prompt, **settings).tolist() for m in (model, adapted, plain))
