"""A tiny llama-architecture GGUF model with random weights, written on the spot for tests.

Takes: a path and a seed. Gives: :func:`write_tiny_llama`, which writes a 2-layer llama model
(64-wide, 4 heads, a ~400-token SentencePiece-style vocabulary with byte fallback, a ChatML
chat template) that ``llama-server`` loads and serves in milliseconds per token.

Why: integration tests need a real model file for a real server, and nothing may be downloaded.
The weights are random (fixed seed), so the text is nonsense, but everything around it is real:
tokenisation, the chat template, sampling, context limits, usage counts and stop reasons.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CHATML_TEMPLATE", "write_tiny_llama"]

#: The ChatML template (``<|im_start|>role\\ncontent<|im_end|>``), as Jinja for llama.cpp.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS = [
    "the",
    "a",
    "an",
    "and",
    "but",
    "so",
    "then",
    "once",
    "upon",
    "time",
    "there",
    "was",
    "little",
    "big",
    "small",
    "happy",
    "sad",
    "cat",
    "dog",
    "bird",
    "tree",
    "sun",
    "moon",
    "star",
    "sky",
    "sea",
    "boat",
    "house",
    "garden",
    "friend",
    "mother",
    "father",
    "girl",
    "boy",
    "named",
    "lily",
    "tom",
    "ben",
    "mia",
    "played",
    "ran",
    "jumped",
    "saw",
    "found",
    "made",
    "said",
    "loved",
    "wanted",
    "went",
    "looked",
    "smiled",
    "laughed",
    "cried",
    "with",
    "in",
    "on",
    "at",
    "to",
    "of",
    "for",
    "from",
    "under",
    "over",
    "near",
    "far",
    "day",
    "night",
    "morning",
    "park",
    "ball",
    "toy",
    "red",
    "blue",
    "green",
    "yellow",
    "kind",
    "brave",
    "shy",
    "quiet",
    "loud",
    "fast",
    "slow",
    "very",
    "too",
    "not",
    "no",
    "yes",
    "they",
    "he",
    "she",
    "it",
    "we",
    "you",
    "i",
    "is",
    "was",
    "were",
    "be",
    "had",
    "has",
    "have",
    "do",
    "did",
    "can",
    "could",
    "will",
    "would",
    "one",
    "two",
    "three",
    "every",
    "all",
    "some",
    "Iris",
    "Calloway",
    "wrote",
    "story",
    "end",
    ".",
]


def write_tiny_llama(
    path: str | Path,
    *,
    seed: int = 0,
    context_length: int = 4096,
    chat_template: str = CHATML_TEMPLATE,
    add_bos: bool = False,
    eos_token_id: int = 4,
) -> Path:
    """Write the model to ``path`` (a ``.gguf`` file) and return the path.

    ``chat_template``, ``add_bos`` and ``eos_token_id`` make variants for tests that plant a
    difference between the model and its tokenizer files (the default is ChatML, no BOS added,
    ``<|im_end|>`` as EOS)."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    n_embd, n_head, n_layer, n_ff = 64, 4, 2, 128
    head_dim = n_embd // n_head

    tokens: list[str] = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
    ]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    pieces = ["\u2581"] + [f"\u2581{w}" for w in _WORDS] + list("abcdefghijklmnopqrstuvwxyz.,!?:")
    for piece in dict.fromkeys(pieces):
        tokens.append(piece)
        types.append(gguf.TokenType.NORMAL)
    scores = [0.0] * 261 + [-float(i) / 100 for i in range(len(tokens) - 261)]
    n_vocab = len(tokens)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("storyforge tiny test llama")
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos_token_id)  # 4 = <|im_end|>, which ends a ChatML turn
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(chat_template)

    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd, scale=1.0))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    output = weight(n_vocab, n_embd, scale=1.0)
    output[:261] *= 0.0  # control and byte tokens are never likely: readable nonsense, long answers
    writer.add_tensor("output.weight", output)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
