"""SGLangRolloutWorker: the rollout engine on SGLang's offline ``Engine`` (``rollout.backend:
sglang``), one Ray actor per engine, in its own image / ``runtime_env`` (SGLang pins its torch).

Design notes
------------
* **Tested against the API contract, not a running SGLang.** SGLang 0.5.23 cannot be installed
  on this workplace's machines (docs/sglang.md). Every engine method called here is checked
  against the real wheel's source, and the backend's tests run on ``FakeSGLangEngine``, which
  enforces SGLang's rules (``FP8RL_SGLANG_ENGINE=fake`` selects it; results say ``sglang-fake``).
* **Same codes, different kernels.** The engine holds exactly the trainer's FP8 codes and
  128×128 scales (and KV scales), but multiplies them with SGLang's kernels: logprobs are not
  bitwise equal to the trainer's, so ``precision.exact`` is refused and the mismatch is
  measured by the run's mismatch metrics, never assumed zero.
* **Start-up.** A config-only directory (``config.json`` with the ``hf-fp8`` export's
  ``quantization_config``), ``load_format: dummy``; version 0 then arrives through the weight-update
  path (one loading path). SGLang's block-FP8 rules are checked first (``block_fp8_problems``), so
  a model SGLang cannot fuse fails here with the layers named.
* **Weight updates: validate, then one session.** ``WeightReceiver.accept`` checks the whole
  update (names, shapes, dtypes, checksums, fingerprint, version) before anything is sent; a
  refused update never opens a session. Then ``begin_weight_update`` → bucketed
  ``update_weights_from_tensor`` → ``end_weight_update`` (which re-finalises SGLang's FP8
  layouts), then a short probe session reads the KV scales back (``sglang_probe``): a scale SGLang
  dropped would have become its default 1.0. If any step fails, the last good version is
  reloaded in a fresh session and the update raises ``SGLangUpdateFailed`` (version unchanged);
  if the reload fails too the engine refuses to generate. It never serves a half-updated model.
* **Transport.** Payloads reach this actor over fp8rl's transports (object store, CUDA IPC,
  NCCL) and go to SGLang as tensors (CUDA IPC within the node). SGLang's own named NCCL group
  (``update_weights_from_distributed``) is not used: it would load bytes this actor never saw,
  so checksums could not be verified before the first byte is written.
* **Memory.** With ``enable_memory_saver``, ``release_memory``/``resume_memory`` wrap SGLang's
  release/resume; weights come back undefined (no CPU backup), so ``resume_memory`` reloads the
  last good version from the host copy this actor keeps.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fp8rl.protocol import (
    Handshake,
    ModelSpec,
    PrecisionSpec,
    RolloutRequest,
    RolloutResult,
    RolloutSample,
    SGLangRollout,
    WeightUpdate,
)
from fp8rl.workers.common import handshake, load_model
from fp8rl.workers.model.build import layer_precision
from fp8rl.workers.model.loading import resolve_model
from fp8rl.workers.rollout.backend import RolloutBackend
from fp8rl.workers.rollout.sglang_adapter import (
    PROBE_LOADER,
    block_fp8_problems,
    buckets,
    engine_config,
    kv_scale_params,
    parse_output,
    refuse_filters,
    sampling_params,
    server_args,
)
from fp8rl.workers.rollout.sglang_probe import PROBE_DIR_ENV, probe_file
from fp8rl.workers.rollout.vllm import expected_slots
from fp8rl.workers.weight_sync.layout import engine_tensor
from fp8rl.workers.weight_sync.receiver import WeightReceiver

log = logging.getLogger(__name__)

ENGINE_ENV = "FP8RL_SGLANG_ENGINE"
"""``fake`` runs ``FakeSGLangEngine`` instead of ``sglang.Engine`` (tests, labelled demo runs)."""


class SGLangUpdateFailed(RuntimeError):
    """SGLang failed during a weight-update session; the message says what was reloaded."""


class SGLangRolloutWorker(RolloutBackend):
    """Rollout actor on ``sglang.Engine`` (same interface as the native and vLLM workers).

    Args:
        model, rollout, precision: its sub-specs (``rollout.backend`` must be ``sglang``).
        device: ``auto`` | ``cpu`` | ``cuda`` (real SGLang needs CUDA; the fake runs on CPU).
        rank: index among rollout workers. seed: dummy-weight and sampler seed.
    Raises:
        ValueError: wrong backend, ``precision.exact``, top-k/top-p filters, a model SGLang
            cannot hold in block FP8 (layers named), or SGLang asked for on CPU.
    """

    def __init__(
        self,
        model: ModelSpec,
        rollout: SGLangRollout,
        precision: PrecisionSpec,
        *,
        device: str = "auto",
        rank: int = 0,
        seed: int = 0,
    ) -> None:
        if rollout.backend != "sglang":
            raise ValueError(f"SGLangRolloutWorker is the sglang backend; got {rollout.backend}")
        refuse_filters(rollout.top_k, rollout.top_p)
        if precision.exact:
            raise ValueError(
                "precision.exact: true needs fp8rl's batch-invariant kernels; SGLang runs its own "
                "(same FP8 codes, different kernels): set precision.exact: false, or use "
                "rollout.backend: native or vllm"
            )
        self.spec, self.precision, self.rank, self.model_spec = rollout, precision, rank, model
        self.layer_precision = layer_precision(model, precision, role="rollout", trainable=False)
        source = resolve_model(model.path)
        self.config = source.config
        self.eos = list(source.config.eos_token_id)
        self.slots = expected_slots(source.config, self.layer_precision)
        problems = block_fp8_problems(
            self.config, self.layer_precision, rollout.tensor_parallel_size
        )
        if problems:
            raise ValueError(
                "SGLang cannot hold this model in block FP8:\n  " + "\n  ".join(problems)
            )
        self.fingerprint = precision.quant.fingerprint() if self.layer_precision.fp8 else None
        self.receiver = WeightReceiver(self.layer_precision, self.fingerprint)
        self.kv_params = kv_scale_params(self.slots)
        self.fake = os.environ.get(ENGINE_ENV) == "fake"
        self.backend_name = "sglang-fake" if self.fake else "sglang"
        self.device = torch.device("cpu" if self.fake else "cuda")
        if device not in ("auto", self.device.type):
            raise ValueError(
                f"resources.device={device}, but {self.backend_name} runs on {self.device}"
            )
        self._dir = Path(tempfile.mkdtemp(prefix="fp8rl-sglang-"))
        self.broken: str | None = None
        self.kv_calibrated = False
        self.engine = self._start_engine(seed)
        initial, _ = load_model(
            model, precision, role="rollout", trainable=False,
            device=torch.device("cpu"), seed=seed, source=source,
        )  # fmt: skip
        self.good = [(n, engine_tensor(initial, n).detach().clone()) for n in self.slots]
        self._load(self.good)

    # -- engine -----------------------------------------------------------------------------

    def _start_engine(self, seed: int) -> Any:
        (self._dir / "config.json").write_text(
            json.dumps(engine_config(self.config, self.layer_precision, self.slots))
        )
        self.probe_dir = self._dir / "probe"
        self.probe_dir.mkdir()
        os.environ[PROBE_DIR_ENV] = str(self.probe_dir)  # SGLang's scheduler processes inherit it
        kwargs = server_args(
            self.spec,
            model_dir=str(self._dir),
            dtype=self.model_spec.dtype,
            max_model_len=self.model_spec.max_model_len,
            kv_fp8=self.layer_precision.kv_fp8,
            fp8=self.layer_precision.fp8,
            seed=seed,
        )
        if self.fake:
            from fp8rl.workers.rollout.sglang_fake import FakeSGLangEngine

            log.warning("rollout[%d]: FAKE SGLang engine (CPU test double, not SGLang)", self.rank)
            return FakeSGLangEngine(**kwargs)
        os.environ["SGLANG_RETURN_ORIGINAL_LOGPROB"] = "false"  # logprobs of logits/T
        import sglang

        return sglang.Engine(**kwargs)

    # -- weight updates ---------------------------------------------------------------------

    def _load(self, named: list[tuple[str, Tensor]]) -> None:
        """Write ``named`` in one session and check the KV scales; reload ``self.good`` on failure.

        Raises:
            SGLangUpdateFailed: the update failed (the engine holds ``self.good`` again, or is
                marked broken when that reload failed too).
        """
        reason = self._session(named)
        if reason is None:
            return
        if named is self.good:
            self.broken = reason
            raise SGLangUpdateFailed(f"SGLang failed to load version {self.version}: {reason}")
        again = self._session(self.good)
        if again is not None:
            self.broken = f"{reason}; reloading version {self.version} failed too: {again}"
            raise SGLangUpdateFailed(f"SGLang weight update failed: {self.broken}")
        raise SGLangUpdateFailed(
            f"SGLang weight update failed: {reason}; the engine was reloaded with version "
            f"{self.version}"
        )

    def _session(self, named: list[tuple[str, Tensor]]) -> str | None:
        """begin → buckets → end, then the KV-scale probe; the reason of a failure, else None."""
        ok, message = self.engine.begin_weight_update()
        if not ok:
            return f"begin_weight_update: {message}"
        parts = buckets(named, self.spec.weight_bucket_mb * 2**20)
        failure = None
        for i, part in enumerate(parts):
            ok, message = self.engine.update_weights_from_tensor(
                part, flush_cache=i == len(parts) - 1
            )
            if not ok:
                failure = f"update_weights_from_tensor (bucket {i + 1}/{len(parts)}): {message}"
                break
        ok, message = self.engine.end_weight_update()
        if failure or not ok:
            return failure or f"end_weight_update: {message}"
        return self._check_kv_scales(dict(named))

    def _check_kv_scales(self, sent: dict[str, Tensor]) -> str | None:
        """Read SGLang's KV scales back (probe session); a mismatch names each scale."""
        expected = {p: float(sent[n]) for n, p in self.kv_params.items() if n in sent}
        if not expected or not all(v > 0 for v in expected.values()):
            return None  # version 0 before calibration: nothing to check (generate refuses)
        ok, message = self.engine.begin_weight_update()
        if not ok:
            return f"begin_weight_update (KV-scale probe): {message}"
        probe = [(p, torch.zeros(())) for p in expected]
        os.environ[PROBE_DIR_ENV] = str(self.probe_dir)  # an in-process (fake) engine reads it now
        for old in self.probe_dir.glob("*.json"):
            old.unlink()
        ok, message = self.engine.update_weights_from_tensor(probe, load_format=PROBE_LOADER)
        ended, end_message = self.engine.end_weight_update()
        if not (ok and ended):
            return f"KV-scale probe: {message if not ok else end_message}"
        ranks = max(1, self.spec.tensor_parallel_size)
        problems = []
        for rank in range(ranks):
            path = probe_file(self.probe_dir, rank)
            if not path.exists():
                return f"KV-scale probe: TP rank {rank} wrote nothing to {path}"
            seen = json.loads(path.read_text())
            problems += [
                f"{p}: SGLang holds {seen.get(p)}, fp8rl sent {v}"
                + (" (SGLang's default: the scale was not loaded)" if seen.get(p) == 1.0 else "")
                for p, v in expected.items()
                if seen.get(p) != v
            ]
        self.kv_calibrated = not problems
        return "; ".join(problems) or None

    # -- the RolloutBackend interface -------------------------------------------------------

    @property
    def version(self) -> int:
        """Policy version of the weights held (0 until the first update)."""
        return self.receiver.version or 0

    def current_version(self) -> int:
        """Policy version of the weights held (0 before the first update)."""
        return self.version

    def handshake(self) -> Handshake:
        """Quant contract report; kernels are SGLang's (``sglang`` or ``sglang-fake``)."""
        report = handshake(
            "rollout", self.precision, self.layer_precision,
            device=self.device, rank=self.rank, backend=self.backend_name,
        )  # fmt: skip
        return report.model_copy(update={"kernel_backend": self.backend_name})

    def generate(self, request: RolloutRequest) -> RolloutResult:
        """n samples per prompt: token ids, logprobs (nats, of logits/T), finish reasons,
        version and fingerprint.

        Raises:
            ValueError: top-k/top-p, a prompt beyond ``model.max_model_len``, or an FP8 KV
                cache whose scales have not been calibrated yet.
            RuntimeError: the engine is broken (a failed reload, reason given).
        """
        if self.broken:
            raise RuntimeError(f"the SGLang engine holds no consistent weights: {self.broken}")
        sp = request.sampling
        refuse_filters(sp.top_k, sp.top_p)
        if self.layer_precision.kv_fp8 and not self.kv_calibrated:
            raise ValueError(
                "the FP8 KV cache is not calibrated (the trainer calibrates it before the first "
                "rollout and ships new scales with every weight update)"
            )
        limit = self.model_spec.max_model_len
        for i, p in enumerate(request.prompts):
            if not p.token_ids or len(p.token_ids) + sp.max_tokens > limit:
                raise ValueError(
                    f"prompt {i} has {len(p.token_ids)} tokens; with max_tokens={sp.max_tokens} "
                    f"it must be non-empty and within model.max_model_len={limit}"
                )
        stop = sorted(set(self.eos) | set(sp.stop_token_ids))
        pairs = [(p, j) for p in request.prompts for j in range(sp.n)]
        start = time.perf_counter()
        outputs = self.engine.generate(
            input_ids=[p.token_ids for p, _ in pairs],
            sampling_params=[sampling_params(sp, stop, index=k) for k in range(len(pairs))],
            return_logprob=True,
        )
        samples = []
        for (prompt, j), out in zip(pairs, outputs, strict=True):
            tokens, logprobs, reason = parse_output(out)
            samples.append(
                RolloutSample(
                    prompt_id=prompt.prompt_id,
                    sample_index=j,
                    prompt_token_ids=prompt.token_ids,
                    token_ids=tokens,
                    logprobs=logprobs,
                    finish_reason=reason,
                    policy_version=self.version,
                    quant_fingerprint=self.fingerprint,
                )
            )
        return RolloutResult(
            request_id=request.request_id,
            samples=samples,
            policy_version=self.version,
            quant_fingerprint=self.fingerprint,
            backend=self.backend_name,
            generation_s=time.perf_counter() - start,
        )

    def init_transport(self, name: str, **kwargs: Any) -> None:
        """Receive weight updates through transport ``name`` (``nccl`` joins its process group)."""
        self.receiver.join(name, **kwargs)

    def apply_weights(self, update: WeightUpdate, handle: Any) -> int:
        """Validate the whole update, then load it into SGLang in one session.

        Raises:
            WeightUpdateRefused: naming each bad tensor; nothing was sent to SGLang.
            SGLangUpdateFailed: SGLang failed mid-session; version unchanged (see ``_load``).
        """
        payload = self.receiver.accept(update, handle, slots=self.slots, device=self.device)
        named = [(n, payload[n]) for n in self.slots]
        self._load(named)
        self.good = [(n, t.detach().cpu()) for n, t in named]
        self.receiver.version = update.version
        self.broken = None
        return update.version

    def release_memory(self) -> None:
        """Free weights, KV cache and CUDA graphs (only with ``enable_memory_saver``)."""
        if self.spec.enable_memory_saver:
            self.engine.release_memory_occupation()

    def resume_memory(self) -> None:
        """Re-allocate what ``release_memory`` freed and reload the last good weights."""
        if self.spec.enable_memory_saver:
            self.engine.resume_memory_occupation()
            self._load(self.good)

    def close(self) -> None:
        """Shut the engine down and remove its config directory."""
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.shutdown()
        shutil.rmtree(self._dir, ignore_errors=True)


__all__ = ["ENGINE_ENV", "SGLangRolloutWorker", "SGLangUpdateFailed"]
