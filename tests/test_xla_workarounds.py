"""The XLA CPU workaround: applied once, never over the user's own choice."""

from __future__ import annotations

from linear_attention import _xla_workarounds as w


def test_import_set_the_flag_or_user_chose(monkeypatch):
  import os
  flags = os.environ.get("XLA_FLAGS", "")
  assert "xla_cpu_experimental_ynn_fusion_type" in flags or os.environ.get(
      "LINEAR_ATTENTION_KEEP_XLA_FLAGS")


def test_user_flag_and_opt_out_are_kept(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=dot")
  assert not w.apply()
  assert __import__("os").environ["XLA_FLAGS"] == "--xla_cpu_experimental_ynn_fusion_type=dot"
  monkeypatch.setenv("XLA_FLAGS", "--foo")
  monkeypatch.setenv("LINEAR_ATTENTION_KEEP_XLA_FLAGS", "1")
  assert not w.apply()
  assert __import__("os").environ["XLA_FLAGS"] == "--foo"


def test_not_applied_after_the_backend_started(monkeypatch):
  import jax.numpy as jnp
  jnp.zeros(1).block_until_ready()  # the backend is up: flags would be ignored
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.delenv("LINEAR_ATTENTION_KEEP_XLA_FLAGS", raising=False)
  assert not w.apply()
