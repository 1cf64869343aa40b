"""The documentation holds: the README's usage example runs and prints what its comment
says, the README and BENCHMARKS.md stay within their sizes, BENCHMARKS.md keeps current
results only, and every pointer from code or docs to a BENCHMARKS.md section or a doc
page names one that exists."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "BENCHMARKS.md"


def test_readme_example_runs():
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    promised = re.search(r"print\(.*\)\s+# (.*)", code).group(1).strip()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert out.getvalue().strip() == promised


def test_readme_and_benchmarks_stay_short():
    assert len(README.read_text().splitlines()) <= 200
    assert len(BENCHMARKS.read_text().splitlines()) <= 500


def test_benchmarks_holds_results_not_history_or_verdicts():
    text = BENCHMARKS.read_text()
    headings = [h.lower() for h in re.findall(r"^#+ (.*)$", text, re.M)]
    assert not [h for h in headings if "earlier" in h or "history" in h]
    verdicts = re.findall(r".*\b(?:MISSED|[Tt]argets?\b[^.|]{0,40}\b(?:met|missed))\b.*", text)
    assert verdicts == [], "targets and verdicts belong in the issues' closing notes"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", lambda m: "_" if m.group() == "_" else "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def sections(path: Path) -> tuple[set[str], set[str]]:
    """(headings, anchors) of a Markdown file."""
    heads = {h.strip().strip("`") for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}
    return heads, {slug(h) for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}


def sources() -> list[Path]:
    """Every file that may point into the docs: the Markdown pages and both packages' code."""
    files = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "bench" / "src").rglob("*.py"))
    files += sorted((ROOT / "benchmarks").rglob("*.py"))
    return [f for f in files if f.is_file()]


def flat(path: Path) -> str:
    """The text with line breaks (and the comment marks that continue a sentence) folded into spaces."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", path.read_text())


def pointers(text: str) -> list[tuple[str, str | None, str | None]]:
    """(page, anchor, quoted section name) for every ``PAGE.md#anchor`` link and ``PAGE.md, "Section"`` mention."""
    out = []
    for m in re.finditer(r"((?:\.\./)*(?:docs/)?[\w-]+\.md)(?:#([\w-]+)|[,:]? \(?\"([^\"]+)\")", text):
        out.append((m.group(1), m.group(2), m.group(3)))
    return out


def page(name: str) -> Path | None:
    base = Path(name).name
    for candidate in (ROOT / base, ROOT / "docs" / base, ROOT / "benchmarks" / base):
        if candidate.is_file():
            return candidate
    return None


def test_every_pointer_to_a_section_names_one_that_exists():
    broken = []
    for src in sources():
        for name, anchor, quoted in pointers(flat(src)):
            target = page(name)
            if target is None:
                if name.upper() == name or name.startswith(("docs/", "../")):
                    broken.append(f"{src.relative_to(ROOT)}: {name} (no such page)")
                continue
            heads, anchors = sections(target)
            if anchor is not None and anchor not in anchors:
                broken.append(f"{src.relative_to(ROOT)}: {name}#{anchor}")
            if quoted is not None and quoted not in heads and not quoted.startswith(("(", "--")):
                broken.append(f'{src.relative_to(ROOT)}: {name}, "{quoted}"')
    assert broken == []


def test_the_pointer_check_finds_a_broken_pointer(tmp_path):
    assert pointers('see BENCHMARKS.md, "No such section" and BENCHMARKS.md#host-engine') == [
        ("BENCHMARKS.md", None, "No such section"), ("BENCHMARKS.md", "host-engine", None)]
    assert slug("Against `sa_spec`") == "against-sa_spec" and slug("The hybrid in vLLM") == "the-hybrid-in-vllm"


def test_the_engine_of_your_own_loop_runs_and_matches_greedy_decoding():
    """docs/engine.md's Drafter loop, on a tiny model whose output repeats: identical to plain greedy
    decoding, in fewer forwards than tokens; and with drafting off, one forward per token."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    text = (ROOT / "docs" / "engine.md").read_text()
    code = text.split("<!-- drafter-loop -->\n```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 40
    scope: dict = {}
    exec(compile(code, "docs/engine.md", "exec"), scope)
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    succ = torch.tensor([t // 6 * 6 + (t % 6 + 1) % 6 for t in range(60)] + [60, 61, 62, 63])  # 6-token cycles
    with torch.no_grad():
        emb = torch.randn(64, 32)
        model.model.embed_tokens.weight.copy_(emb)
        head = torch.empty_like(emb)
        head[succ] = emb
        model.lm_head.weight.copy_(head * 10)
        prompt = [31, 9, 44, 5]
        want = model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False)[0, 4:].tolist()
        got, forwards = scope["speculate"](model, prompt, 60)
        off, forwards_off = scope["speculate"](model, prompt, 60, options={"enabled": False})
    assert got == want and off == want
    assert forwards < 45 and forwards_off == 60


def section_text(path: Path, anchor: str) -> str:
    """The text of the section of ``path`` whose heading has ``anchor``, up to the next heading of the same
    or a higher level (its subsections included)."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(#+) (.*)$", line)
        if m and slug(m.group(2)) == anchor:
            level, body = len(m.group(1)), []
            for nxt in lines[i + 1:]:
                h = re.match(r"^(#+) ", nxt)
                if h and len(h.group(1)) <= level:
                    break
                body.append(nxt)
            return "\n".join(body)
    raise AssertionError(f"{path.name} has no section #{anchor}")


def figure_drift(readme: Path, benchmarks: Path) -> tuple[int, list[str]]:
    """Check the Results table of ``readme``: each row's figures must stand in the ``benchmarks`` section
    its link names. Returns (rows checked, problems)."""
    rows, problems = 0, []
    for line in readme.read_text().split("## Results", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        link = re.search(r"\(BENCHMARKS\.md#([\w-]+)\)", line)
        if len(cells) != 3 or not link:
            continue
        rows += 1
        text = section_text(benchmarks, link.group(1))
        for number in re.findall(r"\d+(?:[.,]\d+)*", cells[1]):
            if not re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", text):
                problems.append(f"README quotes {number} for {cells[0]!r}; BENCHMARKS.md #{link.group(1)} does not")
    return rows, problems


def test_every_figure_the_readme_quotes_stands_in_the_section_it_links():
    rows, problems = figure_drift(README, BENCHMARKS)
    assert rows >= 5 and problems == []


def test_the_figure_check_finds_a_figure_that_drifted(tmp_path):
    bench = tmp_path / "BENCHMARKS.md"
    bench.write_text("# B\n\n## Served\n\nsaspec 20.08 tok/s against 18.99.\n\n## Other\n\n18.59\n")
    readme = tmp_path / "README.md"
    readme.write_text("## Results\n\n| what | figure | section |\n|---|---|---|\n"
                      "| served | 20.08 against 18.99 / 18.59 | [Served](BENCHMARKS.md#served) |\n\n## Next\n")
    assert figure_drift(readme, bench) == (1, ["README quotes 18.59 for 'served'; BENCHMARKS.md #served does not"])


def test_benchmarks_holds_no_before_and_after_pairs():
    text = BENCHMARKS.read_text()
    pairs = re.findall(r".*(?:\bbefore\b[^.|\n]{0,60}\bnow\b|\(before\b|\bwas \d[\d.,]*\b).*", text)
    assert pairs == [], "BENCHMARKS.md keeps current results; what changed belongs in commits and closing notes"
