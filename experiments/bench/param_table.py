"""Size-parity table: every causal mixer's language model at the softmax model's size.

    python experiments/bench/param_table.py                         # d_model 256, 4 layers, vocab 256
    python experiments/bench/param_table.py --d-model 512 --layers 8 --vocab 8192

Writes ``<out>/param_table.json`` and prints one row per mixer: the mixer's
own parameters, the model at the default MLP ratio, the matched MLP width and
the matched model's gap to the reference.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the package and experiments/

from experiments import outputs  # noqa: E402
from linear_attention import models  # noqa: E402
from linear_attention.io import write_json  # noqa: E402


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--d-model", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--vocab", type=int, default=256)
  outputs.add_out(p, "", what="output folder")
  a = p.parse_args(argv)
  rows = models.parity_table(a.vocab, a.d_model, a.layers, num_heads=a.heads)
  write_json(os.path.join(a.out, "param_table.json"),
             dict(d_model=a.d_model, layers=a.layers, heads=a.heads, vocab=a.vocab, rows=rows))
  print(f"d_model {a.d_model}, {a.layers} layers, {a.heads} heads, vocab {a.vocab}; "
        f"reference: softmax with the default MLP")
  print(f"| mixer | mixer params/layer | model, default MLP | matched MLP hidden | "
        f"model, matched | vs softmax |")
  print("| --- | ---: | ---: | ---: | ---: | ---: |")
  for r in rows:
    print(f"| {r['mixer']} | {r['mixer_params']:,} | {r['default_params']:,} | {r['mlp_hidden']} "
          f"| {r['params']:,} | {100 * r['rel_diff']:+.2f}% |")


if __name__ == "__main__":
  main()
