"""A worker: one resident model, many virtual clients run through it one after another."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from raysim.actors.jobs import ClientJob, ClientResult, EvalJob
from raysim.algorithms.base import ClientContext
from raysim.algorithms.registry import BEHAVIOURS, get_method
from raysim.data import FederatedDataset
from raysim.models import DataSpec
from raysim.models.handle import ModelHandle
from raysim.models.layout import Layout
from raysim.models.params import flatten
from raysim.privacy.clipping import ClientPrivacy
from raysim.robust.rules import norm_bound
from raysim.sim.build import data_spec, method_resident
from raysim.state.store import load_entry, store_at
from raysim.tracking import timeline
from raysim.training.loop import evaluate, local_accuracy, make_optimizer
from raysim.training.tasks import task_for
from raysim.util.quiet import quiet_libraries

#: Prefix of ``ClientContext.state`` entries in a client's stored entry (no parameter name
#: starts with "@", so they never meet the model's personal tensors).
STATE_PREFIX = "@state/"

#: Clients whose data tensors a runner keeps (oldest dropped first).
TENSOR_CACHE_CLIENTS = 1024


class ClientRunner:
    """Builds the model once; swaps clients by loading a weight vector, never by rebuilding.

    Plain Python so it runs inside a Ray actor (``Worker``) or in-process (local executor, tests).
    """

    def __init__(
        self,
        config: Any,
        dataset: FederatedDataset | None,
        threads: int = 1,
        spec: DataSpec | None = None,
    ) -> None:
        from raysim.config import config_from_wire

        torch.set_num_threads(threads)
        quiet_libraries()
        self.cfg = config_from_wire(config)
        if self.cfg.workers.cuda_deterministic and torch.cuda.is_available():
            deterministic_cuda()
        self.dataset = dataset
        spec = spec or data_spec(dataset)
        self.method = get_method(self.cfg.algorithm.name)
        self.model = method_resident(self.cfg, spec)
        self.task = task_for(spec, next(self.model.module.parameters()).device)
        self.client_algorithm = self.method.client(self.cfg.algorithm.params)
        self._sequential_reason: str | None = None  # see ``sequential_reason``
        self._group_size: int | None = None  # see ``group_size``
        self.behaviours = [BEHAVIOURS.get(name).build(p) for name, p in self.cfg.client_hooks()]
        for b in self.behaviours:
            b.setup(self.cfg.seed, self.cfg.clients.num)
        robust = self.cfg.robust
        #: robust.rule norm_bound's M: each delta scaled to norm ≤ M on the worker (Sun et al.)
        self.norm_bound = robust.norm_bound.max_norm if robust.rule == "norm_bound" else None
        #: each delta clipped (and noised, local DP) before it leaves: ``raysim.privacy``
        self.privacy = None
        if self.cfg.privacy.enabled:
            self.privacy = ClientPrivacy(self.cfg.privacy, self.cfg.seed, self.cfg.clients.num)
        self.jobs_run = 0
        self.train_s = 0.0  # wall seconds in run_batch (clients' local work)
        self.eval_s = 0.0  # wall seconds in evaluate_batch
        self._noticed = False  # the one-line notice that batched execution fell back
        self._replicas: list[ModelHandle] = []  # copies of the model for jobs trained together
        self._data: dict[int, Any] = {}
        self._eval_tensors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._initial = self.model.get_global()
        # torch.optim imports torch._dynamo lazily on first use (~1.5 s); pay it at start-up.
        make_optimizer(self.model.global_parameters(), self.cfg.local)

    @property
    def group_size(self) -> int:
        """Jobs of one batch that train together (``RunConfig.group_size``); 1 where
        ``workers.execution: auto`` finds this model's clients cannot batch. Decided once."""
        if self._group_size is None:
            size = self.cfg.group_size()
            if size > 1 and self.cfg.workers.execution == "auto" and self.sequential_reason():
                size = 1
            self._group_size = size
        return self._group_size

    def sequential_reason(self) -> str:
        """Why this method's clients train one after another on this model ("" when they batch):
        its client's ``unbatchable`` asked once, on client 0's context at the initial weights.
        A group can still fall back on its own (different local settings, uneven data)."""
        if self._sequential_reason is None:
            algo = self.client_algorithm
            if algo.trains_together:  # a round that trains together is one group by nature
                self._sequential_reason = ""
            elif not algo.may_batch():
                self._sequential_reason = (
                    f"{type(algo).__name__} trains its own way (it overrides train)"
                )
            else:
                job = ClientJob(job_id=-1, client=0, dispatch_round=0, run_seed=self.cfg.seed)
                ctx, _ = self._context(self._initial, job)
                self._sequential_reason = algo.unbatchable([ctx])
        return self._sequential_reason

    def initial_global(self) -> tuple[np.ndarray, Layout]:
        """The global vector as built (before any job) and its layout."""
        return self._initial, self.model.layout()

    def client_data(self, client: int) -> Any:
        """A client's data as tensors, cached (bounded) so repeat visits cost nothing."""
        hit = self._data.get(client)
        if hit is None:
            hit = to_tensors(self.dataset.client_data(client))
            if len(self._data) >= TENSOR_CACHE_CLIENTS:
                self._data.pop(next(iter(self._data)))
            self._data[client] = hit
        return hit

    def resolve(self, handle: Any) -> Any:
        """The value behind an ``Executor.put`` handle (in-process: the value itself)."""
        return handle

    def view_of(self, client: int | None) -> None:
        """Model-side per-client input shifts (``data.shift.kind: embedding``): shift the next
        forward passes as ``client`` sees its inputs (None: unshifted)."""
        shifts = getattr(self.dataset, "shifts", None)
        if shifts is None or shifts.cfg.kind != "embedding":
            return
        if getattr(self, "_embedding_shift", None) is None:
            from raysim.data.shifts import EmbeddingShift, embedding_model

            target = embedding_model(self.model.module)
            if target is None:
                raise ValueError(
                    "data.shift.kind embedding needs a model with input embeddings "
                    "(model.name lm_classifier)"
                )
            self._embedding_shift = EmbeddingShift(shifts, target)
        self._embedding_shift.use(client)

    def run(self, weights: np.ndarray, job: ClientJob) -> ClientResult:
        """One client's local work on the global ``weights``, with its personal state swapped in.

        Client behaviours (``hooks.clients``) that apply to this job change its data before and
        its delta after the method's local work."""
        ctx, active = self._context(weights, job)
        return self._result(weights, job, ctx, active, self.client_algorithm.train(ctx))

    def run_together(self, weights: Weights, jobs: list[ClientJob]) -> list[ClientResult]:
        """A group of jobs trained together: coupled in one ``train_together`` call when the
        method's clients train together (each on its own replica of the model), else in one
        batched pass per step (``ClientAlgorithm.train_batched``: the global parameters of each
        client stacked, the rest of the resident model shared), else one after another.
        ``weights``: the version they all start from, or one per job (``each_job``)."""
        algo = self.client_algorithm
        if algo.trains_together:
            return self._run_coupled(weights, jobs)
        starting = each_job(weights, jobs)
        why = self.sequential_reason()  # this model at all (asked once): load no job twice
        if why:
            self._notice(why)
            return [self.run(w, job) for w, job in zip(starting, jobs, strict=True)]
        prepared, starts = [], []
        groups = [g.name for g in self.model.groups]
        shared = not self.model.personal_groups()  # a job's start is then its version alone
        loaded, start = None, {}  # the version in the model, and the start taken from it
        for weights, job in zip(starting, jobs, strict=True):
            again = shared and weights is loaded
            ctx, active = self._context(weights, job, loaded=again)
            if not again:
                start = {g: [p.detach().clone() for p in self.model.group_parameters(g)]
                         for g in groups}  # fmt: skip
                loaded = weights
            starts.append(start)  # read only (stacked), so jobs on one version share it
            prepared.append((weights, job, ctx, active))
        ctxs = [ctx for _, _, ctx, _ in prepared]
        why = algo.unbatchable(ctxs)
        if why:
            self._notice(why)
            return [self.run(w, job) for w, job in zip(starting, jobs, strict=True)]
        with timeline.span("batched pass", jobs[0].dispatch_round):
            finals, metrics = algo.train_batched(self.model, ctxs, starts)
        results = []
        direct = self._results_from_finals(groups)
        for (weights, job, ctx, active), final, m in zip(prepared, finals, metrics, strict=True):
            if direct and not active:  # the update straight from the trained tensors
                trained = flatten(final[self.model.global_adapter])
                results.append(self._result(weights, job, ctx, active, m, trained))
                continue
            self._load(weights, job)
            with torch.no_grad():
                for group, tensors in final.items():
                    for p, value in zip(self.model.group_parameters(group), tensors, strict=True):
                        p.copy_(value)
            results.append(self._result(weights, job, ctx, active, m))
        return results

    def _results_from_finals(self, groups: list[str]) -> bool:
        """Whether a batched job's update is its trained global tensors, flattened, minus its
        start: a model whose only group is the global one and which has no buffers, with no
        local accuracy to score (the long way loads each job's model back first; the two give
        the same bits)."""
        m = self.model
        return groups == [m.global_adapter] and m.global_is_parameters and not self.local_accuracy

    @property
    def local_accuracy(self) -> bool:
        """Whether each job's local model is scored on the test set (``eval.local_accuracy``)."""
        return self.cfg.eval.local_accuracy and isinstance(self.dataset, FederatedDataset)

    def trains_together(self, jobs: int) -> bool:
        """Whether a group of ``jobs`` trains together (batched, or coupled clients: these
        even alone, as a round of one, so exact centring holds for a single job too)."""
        coupled = self.client_algorithm.trains_together
        return self.group_size > 1 and (jobs > 1 or coupled)

    def _notice(self, why: str) -> None:
        """One line, once, where ``workers.execution: batched`` was asked for and not given
        (``auto`` falls back quietly)."""
        if not self._noticed and self.cfg.workers.execution == "batched":
            print(f"raysim: {self.cfg.algorithm.name}'s clients train one after another: {why}")
            self._noticed = True

    def _run_coupled(self, weights: np.ndarray, jobs: list[ClientJob]) -> list[ClientResult]:
        while len(self._replicas) < len(jobs):
            self._replicas.append(copy.deepcopy(self.model))
        prepared = [
            (job, *self._context(weights, job, replica))
            for job, replica in zip(jobs, self._replicas, strict=False)
        ]
        metrics = self.client_algorithm.train_together([ctx for _, ctx, _ in prepared])
        return [
            self._result(weights, job, ctx, active, m)
            for (job, ctx, active), m in zip(prepared, metrics, strict=True)
        ]

    def _load(
        self,
        weights: np.ndarray,
        job: ClientJob,
        model: ModelHandle | None = None,
        loaded: bool = False,
    ) -> dict:
        """The job's global weights and personal state into ``model`` (the resident one by
        default; ``loaded``: it holds ``weights`` already); returns the client's named state
        (``ClientContext.state``)."""
        model = model or self.model
        if not loaded:
            model.set_global(weights)
        model_state, client_state = split_store(load_entry(self.resolve(job.state)))
        model.set_state(model_state, job.seed)
        return client_state

    def _context(
        self,
        weights: np.ndarray,
        job: ClientJob,
        model: ModelHandle | None = None,
        loaded: bool = False,
    ) -> tuple[ClientContext, list]:
        """Load the job's global weights (unless ``loaded``) and personal state into ``model``
        (the resident one by default); its context and the behaviours that apply to it (their
        data and config changes made)."""
        seed = job.seed
        model = model or self.model
        client_state = self._load(weights, job, model, loaded)
        data = self.client_data(job.client)
        self.view_of(job.client)
        torch.default_generator.manual_seed(seed)  # dropout etc.; cheaper than torch.manual_seed
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)
        downlink = dict(self.resolve(job.downlink) or {}) if job.downlink is not None else {}
        downlink.update(job.own or {})
        ctx = ClientContext(
            model,
            self.task,
            data,
            self.cfg.local,
            torch.Generator().manual_seed(seed),
            job.client,
            job.dispatch_round,
            first_visit=job.state is None,
            seed=seed,
            downlink=downlink,
            received=weights,
            state=client_state,
        )
        active = [b for b in self.behaviours if b.applies(job.client, job.dispatch_round)]
        for b in active:
            ctx.data = b.on_data(ctx, ctx.data)
            ctx.config = b.on_local(ctx, ctx.config)
        if job.max_steps is not None:  # devices' partial work: the steps its time allowed
            cap = ctx.config.max_steps
            steps = job.max_steps if cap is None else min(cap, job.max_steps)
            ctx.config = ctx.config.model_copy(update={"max_steps": steps})
        return ctx, active

    def _result(
        self,
        weights: np.ndarray,
        job: ClientJob,
        ctx: ClientContext,
        active: list,
        metrics: dict[str, float],
        trained: np.ndarray | None = None,
    ) -> ClientResult:
        """The job's update, personal state and uplink from the model its context trained
        (``trained``: its global vector, where the caller has it without the model)."""
        data = self.client_data(job.client)
        if self.local_accuracy:
            metrics = {**metrics, "local_accuracy": self._local_accuracy(data, ctx.model)}
        delta = (ctx.model.get_global() if trained is None else trained) - weights
        for b in active:
            delta = b.on_update(ctx, delta)
        if self.norm_bound is not None:  # robust.rule norm_bound: clipped where it is made
            delta = norm_bound(delta, self.norm_bound)
        if self.privacy is not None:
            delta, metrics = self.privacy.apply(delta, ctx.downlink, job.seed, metrics, job.client)
        self.jobs_run += 1
        n = self.task.num_examples(data)
        state: Any = {**ctx.model.get_state(), **store_entries(ctx.state)}
        if state and job.store is not None:  # clients.state.store: disk
            state = store_at(job.store).save(job.client, job.job_id, state)
        finite = bool(np.isfinite(delta).all())  # here, not in the coordinator's serial work
        return ClientResult(
            job.job_id, job.client, delta, n, metrics, state, ctx.uplink, finite=finite
        )

    def _local_accuracy(self, data: Any, model: Any) -> float:
        if "test" not in self._eval_tensors:  # converted once per worker, shared with _score
            ds = self.dataset
            self._eval_tensors["test"] = torch.tensor(ds.x_test), torch.tensor(ds.y_test)
        mode = self.cfg.local.absent_logits
        return local_accuracy(model.module, data[1], self._eval_tensors["test"], mode)

    def evaluate(self, weights: np.ndarray, job: EvalJob) -> dict[str, dict[str, float]]:
        """Scores of one view of ``weights`` (``EvalJob``) on each of its evaluation sets."""
        model = self.model
        model.set_global(weights)
        model_state, client_state = split_store(load_entry(self.resolve(job.state)))
        answer = None
        self.view_of(job.client)
        if job.client is not None or not model.switches_groups:
            # personal groups: the client's state, or (global view) their built values
            model.set_state(model_state, 0)
        if job.adapt:
            seed = job.seed
            torch.default_generator.manual_seed(seed)
            ctx = ClientContext(
                model,
                self.task,
                self.client_data(job.client),
                self.cfg.local,
                torch.Generator().manual_seed(seed),
                job.client,
                job.round,
                seed=seed,
                state=client_state,
            )
            answer = self.client_algorithm.adapt(ctx)
        model.use(job.group if job.client is not None else model.global_adapter)
        try:
            return {name: self._score(name, job.generate, job.client, answer) for name in job.sets}
        finally:
            model.use(model.global_adapter)

    def _score(
        self,
        name: str,
        generate: bool,
        client: int | None = None,
        answer: torch.nn.Module | None = None,
    ) -> dict[str, float]:
        """Labelled sets: accuracy and loss; text sets: loss (and ROUGE-1 when ``generate``).

        ``answer``: the module an ``adapt`` returned to answer instead of the resident one. With
        per-client shifts (``data.shift``) a client scores the test set in its own view."""
        from raysim.data import LabelledSet

        eval_set = self.dataset.eval_sets[name]
        module = self.model.module if answer is None else answer
        if isinstance(eval_set, LabelledSet):
            if name not in self._eval_tensors:  # converted once per worker
                x, y = torch.tensor(eval_set.x), torch.tensor(eval_set.y, dtype=torch.long)
                self._eval_tensors[name] = x, y
            x, y = self._eval_tensors[name]
            shifts = getattr(self.dataset, "shifts", None)
            if shifts is not None and client is not None and name == "test":
                view = shifts.test_view(client)  # the client's own view (cached read-only)
                x = torch.from_numpy(view if view.flags.writeable else view.copy())
            return evaluate(module, x, y)
        from raysim.training.lm_eval import generate as greedy
        from raysim.training.lm_eval import lm_loss
        from raysim.training.text_metrics import rouge1

        ev = self.cfg.eval
        out = lm_loss(self.model.module, eval_set.encoded, ev.batch_size)
        if generate:
            ds = self.dataset
            tokens = greedy(
                self.model.module,
                eval_set.prompts,
                ev.max_new_tokens,
                ds.pad_id,
                ds.eos_id,
                ev.batch_size,
            )
            tok = self._tokenizer()
            answers = [tok.decode(t, skip_special_tokens=True).strip() for t in tokens]
            out["rouge1"] = rouge1(answers, eval_set.references)
        return out

    def _tokenizer(self):
        if getattr(self, "_tok", None) is None:
            self._tok = self.dataset.tokenizer()
        return self._tok

    @property
    def busy_s(self) -> float:
        """Wall seconds this runner spent training and evaluating."""
        return self.train_s + self.eval_s

    def usage(self) -> dict[str, Any]:
        """What this runner did so far: jobs, seconds training and evaluating, and (on a GPU)
        the peak memory its process allocated on the device, for ``workers.json``."""
        from raysim.training.backends import ENGINE_OVERHEAD

        device = next(self.model.module.parameters()).device
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        return {
            "jobs_run": self.jobs_run,
            "train_s": self.train_s,
            "eval_s": self.eval_s,
            "busy_s": self.busy_s,
            "device": str(device),
            "peak_gpu_bytes": peak,
            "deepspeed_engines": ENGINE_OVERHEAD["calls"],
            "deepspeed_engine_s": ENGINE_OVERHEAD["seconds"],
        }

    def evaluate_batch(
        self, weights: np.ndarray, jobs: list[EvalJob]
    ) -> list[dict[str, dict[str, float]]]:
        t0 = time.perf_counter()
        out = [self.evaluate(weights, job) for job in jobs]
        self.eval_s += time.perf_counter() - t0
        return out

    def run_batch(self, weights: Weights, jobs: list[ClientJob]) -> list[ClientResult]:
        """The jobs' results; each carries its share of the batch's wall time (``seconds``).
        ``weights``: the version every job starts from, or one per job (``each_job``)."""
        t0 = time.perf_counter()
        if self.trains_together(len(jobs)):
            out = self.run_together(weights, jobs)
            for r in out:  # trained together: an even share each
                r.seconds = (time.perf_counter() - t0) / len(out)
        else:
            out = []
            for w, job in zip(each_job(weights, jobs), jobs, strict=True):
                t = time.perf_counter()
                out.append(self.run(w, job))
                out[-1].seconds = time.perf_counter() - t
        self.train_s += time.perf_counter() - t0
        return out


#: what a batch of jobs starts from: one global version, or one per job
Weights = np.ndarray | Sequence[np.ndarray]


def each_job(weights: Weights, jobs: Sequence[ClientJob]) -> list[np.ndarray]:
    """The global version each job starts from: the batch's one, or each its own (asynchronous
    jobs computed together across dispatch rounds: ``CoordinatorCore``'s lazy groups)."""
    if isinstance(weights, np.ndarray):
        return [weights] * len(jobs)
    if len(weights) != len(jobs):
        raise ValueError(f"{len(weights)} versions for {len(jobs)} jobs")
    return list(weights)


def deterministic_cuda() -> None:
    """Deterministic CUDA kernels in this process (``workers.cuda_deterministic``): cuBLAS with a
    fixed workspace (set before its first handle: a worker builds its model after this) and
    torch's deterministic algorithms, warning (not failing) where an op has none."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def split_store(stored: Mapping[str, Any] | None) -> tuple[dict[str, Any] | None, dict]:
    """A client's stored entry → (its model's personal state, its ``ClientContext.state``).

    ``None`` (first visit) gives ``(None, {})``. The context's arrays are writable copies: what
    the object store hands back is read-only and shared."""
    if stored is None:
        return None, {}
    model, named = {}, {}
    for key, value in stored.items():
        if key.startswith(STATE_PREFIX):
            named[key[len(STATE_PREFIX) :]] = np.array(value, copy=True)
        else:
            model[key] = value
    return model, named


def store_entries(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``ClientContext.state`` as entries of the client's stored entry (numpy copies)."""
    out = {}
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            value = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
        elif not isinstance(value, (np.ndarray, np.generic, int, float, bool)):
            raise TypeError(
                f"ClientContext.state[{name!r}] is a {type(value).__name__}; "
                "it must hold arrays (numpy or torch) or numbers"
            )
        out[f"{STATE_PREFIX}{name}"] = np.array(value, copy=True)
    return out


def to_tensors(data: Any) -> Any:
    """numpy arrays (alone, in a tuple/list or a dict) → torch tensors (copies, writable)."""
    if isinstance(data, dict):
        return {k: to_tensors(v) for k, v in data.items()}
    if isinstance(data, (tuple, list)):
        return type(data)(to_tensors(v) for v in data)
    return torch.tensor(np.asarray(data))


class RayClientRunner(ClientRunner):
    """The runner inside a Ray worker actor (``raysim.actors.worker_actor.Worker``): a nested
    handle (a client's personal state) is an object ref, read from the object store."""

    def resolve(self, handle: Any) -> Any:
        import ray

        return ray.get(handle) if isinstance(handle, ray.ObjectRef) else handle
