"""Multi-process training on torch.distributed: launching, model wrapping, collective helpers, checkpoint state.

Launching (`call_main(cfg, main)`, the only entry the training loop uses), first match wins:
  1. torchrun: RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT in the environment (WORLD_SIZE > 1):
     this process is one rank; the process group is initialised from the environment (`env://`).
  2. srun (SLURM_STEP_ID, SLURM_PROCID, ... in the environment): the ranks from SLURM's variables, one task per
     GPU or one task per node that spawns its node's ranks (seqtrain.slurm).
  3. --distributed-world-size N > 1 with --distributed-no-spawn and --distributed-init-method URL: a rank started
     by some other launcher (SLURM scripts): rank --distributed-rank, device --device-id.
  4. --distributed-world-size N > 1: spawn N processes on this node (torch.multiprocessing.spawn), one per GPU,
     or N CPU processes with gloo under --cpu / without CUDA.
  5. Otherwise `main(cfg)` runs in this process.
Backend: nccl on CUDA, gloo on the CPU (--distributed-backend overrides); collectives time out after
--distributed-timeout seconds, so a rank waiting on a dead peer fails instead of hanging. A rank that raises
prints its error with its rank; the spawn path then stops the other ranks and ends with a SeqtrainError naming the
rank, and torchrun's agent tears the group down itself.

Model wrapping (`wrap_model`): --ddp-backend c10d (alias pytorch_ddp, legacy_ddp, no_c10d) is
DistributedDataParallel; fully_sharded is FSDP2 (`fully_shard` per transformer layer, then the root).
DDP and FSDP both *average* gradients over ranks; the Trainer multiplies by world_size / (global sample size), so
the update equals a one-process run over the same global batch.

Checkpoint state: FSDP parameters and optimizer state are gathered into full (unsharded) tensors on rank 0, and the
optimizer state is converted to torch's plain integer-keyed layout, so every checkpoint has one format and resumes
at any world size, with or without FSDP, and loads in seqtrain-generate.

Collectives without host syncs: `sum_logging_outputs` sums an update's logged figures over ranks on the device
(the trainer reads them once, with the gradient norm); `agree` makes every rank take a stop decision together.

Why one module: launching, wrapping and the collective and checkpoint helpers share the process-group state and
the rank conventions (who writes, who reduces); apart, each would restate the others' assumptions.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import os
import re
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException
from torch.nn.parallel import DistributedDataParallel

from seqtrain.config import setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import Bounds
from seqtrain.slurm import slurm_task

logger = logging.getLogger(__name__)

DDP_ALIASES = ("c10d", "pytorch_ddp", "legacy_ddp", "no_c10d")
SPAWN_GRACE_S = 5.0
PEER_LOSS_DELAY_S = 2.0
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@settings
class LaunchConfig:
    """Distributed training: how the ranks are started and joined (the --distributed-* flags, --device-id;
    --cpu is the common flag's)"""

    distributed_world_size: int = setting(
        1,
        "total number of processes (GPUs) across all nodes",
        type=int,
        metavar="N",
        bounds=Bounds(1, 65536),
    )
    distributed_rank: int = setting(0, "rank of this process", type=int, metavar="N", bounds=Bounds(0, 65535))
    distributed_backend: str | None = setting(
        None, "torch.distributed backend (default: nccl on CUDA, gloo on the CPU)", metavar="NAME"
    )
    distributed_timeout: float = setting(
        1800,
        "a collective waiting longer than this on another rank fails (instead of hanging)",
        type=float,
        metavar="SECONDS",
        bounds=Bounds(0, 1e7, lo_open=True),
    )
    distributed_init_method: str | None = setting(
        None, "init method, e.g. tcp://host:port (default: from torchrun's environment)", metavar="URL"
    )
    distributed_port: int = setting(
        -1, "port for the init method", type=int, metavar="N", bounds=Bounds(1, 65535, off=-1)
    )
    device_id: int = setting(
        0,
        "which local GPU to use",
        flags=("--device-id", "--local_rank"),
        type=int,
        metavar="N",
        bounds=Bounds(0, 65535),
    )
    distributed_no_spawn: bool = setting(
        False,
        "do not spawn one process per GPU (processes are launched externally, e.g. by torchrun)",
        action="store_true",
    )
    cpu: bool = False  # DeviceConfig's --cpu

    @property
    def uses_cuda(self) -> bool:
        return torch.cuda.is_available() and not self.cpu


@settings
class DataParallelConfig:
    """Distributed training: how the model is wrapped when there are several ranks (--ddp-backend and its DDP
    settings)"""

    ddp_backend: str = setting(
        "pytorch_ddp",
        "data-parallel wrapper: DistributedDataParallel (pytorch_ddp, c10d, legacy_ddp, no_c10d are one) or "
        "fully_sharded (FSDP2: parameters, gradients and optimizer state sharded over ranks)",
        choices=("pytorch_ddp", "c10d", "legacy_ddp", "no_c10d", "fully_sharded"),
    )
    bucket_cap_mb: int = setting(25, "DDP bucket size", type=int, metavar="MB", bounds=Bounds(1, 65536))
    find_unused_parameters: bool = setting(False, "DDP find_unused_parameters", action="store_true")


# ---------------------------------------------------------------------------------------------------- queries
def env_world_size() -> int:
    """WORLD_SIZE set by torchrun (1 when absent or malformed)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def is_master(cfg: LaunchConfig) -> bool:
    return cfg.distributed_rank == 0


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def barrier() -> None:
    if get_world_size() > 1:
        dist.barrier()


def backend_for(cfg: LaunchConfig) -> str:
    backend = cfg.distributed_backend or ("nccl" if cfg.uses_cuda else "gloo")
    if backend == "nccl" and not cfg.uses_cuda:
        raise SeqtrainError("--distributed-backend nccl needs CUDA devices; use gloo for CPU training")
    return backend


# ---------------------------------------------------------------------------------------------------- launching
def _torchrun_env() -> dict[str, int] | None:
    if not all(v in os.environ for v in _TORCHRUN_VARS):
        if env_world_size() > 1:
            missing = ", ".join(v for v in _TORCHRUN_VARS if v not in os.environ)
            raise SeqtrainError(
                f"WORLD_SIZE={env_world_size()} is set but {missing} not: launch with torchrun "
                "(or unset WORLD_SIZE and use --distributed-world-size N)"
            )
        return None
    try:
        env = {k: int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    except ValueError:
        raise SeqtrainError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (set by torchrun)") from None
    return env if env["WORLD_SIZE"] > 1 else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call_main(cfg: LaunchConfig, main: Callable[[LaunchConfig], Any]) -> Any:
    """Run `main(cfg)` on every rank of the job this process belongs to (see the module docstring), `cfg`'s
    world size, rank and device id set to the rank's (a spawned rank gets its own copy)."""
    env = _torchrun_env()
    world_size = cfg.distributed_world_size
    if env is not None:
        if world_size > 1 and world_size != env["WORLD_SIZE"]:
            logger.warning(
                f"--distributed-world-size {world_size} ignored: torchrun started "
                f"{env['WORLD_SIZE']} processes"
            )
        cfg.distributed_world_size = env["WORLD_SIZE"]
        cfg.distributed_rank = env["RANK"]
        cfg.device_id = env["LOCAL_RANK"]
        return distributed_main(cfg, main, "env://")
    task = slurm_task(cfg.distributed_port, world_size, torch.cuda.device_count() if cfg.uses_cuda else 0)
    if task is not None:
        if world_size > 1 and world_size != task.world_size:
            logger.warning(
                f"--distributed-world-size {world_size} ignored: the SLURM job has {task.world_size} ranks"
            )
        cfg.distributed_world_size = task.world_size
        if task.procs_per_task > 1:  # one task per node: it starts its node's ranks
            return _spawn(cfg, main, task.procs_per_task, task.init_method, rank_offset=task.rank)
        cfg.distributed_rank, cfg.device_id = task.rank, task.local_rank
        return distributed_main(cfg, main, task.init_method)
    if world_size <= 1:
        cfg.distributed_world_size = 1
        cfg.distributed_rank = 0
        return main(cfg)
    if cfg.distributed_no_spawn:
        if not cfg.distributed_init_method:
            raise SeqtrainError(
                "--distributed-no-spawn needs torchrun's environment (RANK, WORLD_SIZE, ...) or "
                "--distributed-init-method URL with --distributed-rank"
            )
        return distributed_main(cfg, main, cfg.distributed_init_method)
    if cfg.uses_cuda and world_size > torch.cuda.device_count():
        raise SeqtrainError(
            f"--distributed-world-size {world_size}: this node has {torch.cuda.device_count()} "
            "CUDA devices; for several nodes launch with torchrun (see the README)"
        )
    port = cfg.distributed_port if cfg.distributed_port > 0 else _free_port()
    init_method = cfg.distributed_init_method or f"tcp://127.0.0.1:{port}"
    return _spawn(cfg, main, world_size, init_method)


def _spawn(cfg: LaunchConfig, main: Callable, nprocs: int, init_method: str, rank_offset: int = 0) -> None:
    """Start ranks rank_offset .. rank_offset + nprocs - 1 of the job on this node, one process each."""
    context = torch.multiprocessing.spawn(
        _spawned_rank, args=(cfg, main, init_method, rank_offset), nprocs=nprocs, join=False
    )
    try:
        # After a rank fails, the others get SPAWN_GRACE_S seconds to end by themselves (gloo peers notice the
        # closed connection at once), then SIGTERM, then SIGKILL after as long again.
        while not context.join(grace_period=SPAWN_GRACE_S):
            pass
    except ProcessRaisedException as e:
        # spawn has already terminated the other ranks; the failed rank printed its own traceback.
        # the exception's own line: the last unindented "Name: message" line of the child's traceback
        lines = [line for line in str(e).splitlines() if re.match(r"[\w.]+: ", line)]
        last = lines[-1] if lines else "see its error above"
        prefix = f"{SeqtrainError.__module__}.{SeqtrainError.__name__}: "
        message = last[len(prefix) :] if last.startswith(prefix) else f"rank {e.error_index} failed: {last}"
        raise SeqtrainError(f"{message} (the other ranks were stopped)") from None
    except ProcessExitedException as e:
        raise SeqtrainError(
            f"rank {e.error_index} exited with code {e.exit_code} (killed, e.g. out of "
            "memory?); the other ranks were stopped"
        ) from None


def _spawned_rank(index: int, cfg: LaunchConfig, main: Callable, init_method: str, rank_offset: int) -> None:
    cfg.distributed_rank = rank_offset + index
    cfg.device_id = index
    distributed_main(cfg, main, init_method, print_traceback=True)


def distributed_main(
    cfg: LaunchConfig,
    main: Callable[[LaunchConfig], Any],
    init_method: str,
    print_traceback: bool = False,
) -> Any:
    """One rank: set the device, join the process group, run `main`, leave the group cleanly. An error leaves
    with its rank in the message (`print_traceback`: also print the traceback, which a spawned child's parent
    would otherwise reduce to one line)."""
    rank, world_size = cfg.distributed_rank, cfg.distributed_world_size
    backend = backend_for(cfg)
    device = None
    if cfg.uses_cuda:
        torch.cuda.set_device(cfg.device_id)
        device = torch.device("cuda", cfg.device_id)
    timeout = datetime.timedelta(seconds=float(cfg.distributed_timeout))
    dist.init_process_group(
        backend,
        init_method=init_method,
        world_size=world_size,
        rank=rank,
        timeout=timeout,
        **({"device_id": device} if device is not None and backend == "nccl" else {}),
    )
    logger.info(f"distributed init (rank {rank} of {world_size}, backend {backend}): {init_method}")
    try:
        result = main(cfg)
    except SeqtrainError as e:
        raise SeqtrainError(f"rank {rank}: {e}") from None
    except BaseException as e:
        # Peers blocked in a collective are stopped by the launcher (spawn / torchrun), or time out.
        if print_traceback:
            traceback.print_exc()
        print(f"seqtrain: rank {rank} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if _lost_peer(e):
            # Only a consequence of another rank's failure: leave after it, so that the launchers, which report
            # the first rank to exit, name the rank that failed first.
            time.sleep(PEER_LOSS_DELAY_S)
        raise
    leave_process_group()
    return result


def leave_process_group() -> None:
    """End this rank's part of the job so that no rank aborts at exit.

    DDP's reducer and FSDP's state hold the process group; when they sit in a reference cycle they are freed
    only by a later garbage collection, at interpreter exit, after the group was destroyed, and the gloo group
    torn down there can end the process with SIGABRT ("terminate called without an active exception"). So
    collect them first, while the group is alive. Then leave together: a rank that closes its gloo connections
    while a peer still uses them can make the peer abort in gloo's background thread."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()


def _lost_peer(e: BaseException) -> bool:
    text = str(e)
    return isinstance(e, getattr(dist, "DistNetworkError", ())) or any(
        marker in text for marker in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
    )


# ---------------------------------------------------------------------------------------------------- model wrapping
def is_fsdp(model: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule  # FSDP only (--ddp-backend fully_shard)
    except ImportError:  # pragma: no cover - torch < 2.6
        return False
    return isinstance(model, FSDPModule)


def transformer_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks FSDP shards one by one: the entries of every ModuleList named `layers` (encoder, decoder)."""
    return [
        layer
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] == "layers"
        for layer in module
    ]


def wrap_model(
    cfg: DataParallelConfig, model: torch.nn.Module, device: torch.device, low: torch.dtype | None = None
) -> torch.nn.Module:
    """The module the training forward pass runs through: `model` itself for one process, DDP around it, or
    `model` sharded in place by FSDP2 (then the returned module *is* `model`; build the optimizer after this).
    `low`: the autocast dtype (fp16 / bf16), FSDP's compute dtype for the gathered parameters."""
    if get_world_size() <= 1:
        return model
    backend = cfg.ddp_backend
    if backend == "fully_sharded":
        from torch.distributed.fsdp import (  # FSDP only (--ddp-backend fully_shard)
            MixedPrecisionPolicy,
            fully_shard,
        )

        # Parameters are gathered in the low precision for compute; gradients are reduced in fp32.
        policy = MixedPrecisionPolicy(
            param_dtype=low, reduce_dtype=torch.float32 if low is not None else None
        )
        for layer in transformer_layers(model):
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    if backend not in DDP_ALIASES:
        raise SeqtrainError(
            f"--ddp-backend {backend}: choose from c10d (= {', '.join(DDP_ALIASES[1:])}) or fully_sharded"
        )

    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        output_device=device.index if device.type == "cuda" else None,
        bucket_cap_mb=cfg.bucket_cap_mb,
        find_unused_parameters=cfg.find_unused_parameters,
        broadcast_buffers=False,  # BART has no running statistics to keep in step
    )


@contextlib.contextmanager
def no_sync(forward_model: torch.nn.Module, skip_sync: bool) -> Iterator[None]:
    """Within it, backward accumulates gradients locally without reducing them (all but the last micro-batch of
    an --update-freq update)."""
    if not skip_sync or get_world_size() <= 1:
        yield
        return
    if is_fsdp(forward_model):
        forward_model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            forward_model.set_requires_gradient_sync(True)
        return
    sync_off = getattr(forward_model, "no_sync", None)
    with sync_off() if sync_off is not None else contextlib.nullcontext():
        yield


# ---------------------------------------------------------------------------------------------------- collectives
def sum_logging_outputs(
    logging_outputs: list[dict[str, Any]], device: torch.device
) -> tuple[list[str], torch.Tensor]:
    """(keys, sums): each key of the logging outputs summed over the list and over all ranks, as one fp64 vector
    on the device of their tensors, else on `device` (fp64, so counts stay exact). Nothing is read back to the
    host: device tensors are summed on the device, host numbers on the host, and the ranks' vectors in one
    all-reduce, so the caller reads every figure with one transfer when it needs them.
    Every rank must pass the same keys; their order does not matter."""
    keys = sorted({k for log in logging_outputs for k in log})
    tensors = [v for log in logging_outputs for v in log.values() if torch.is_tensor(v)]
    device = tensors[0].device if tensors else device  # where the figures already are
    host = [0.0] * len(keys)
    on_device: list[list[torch.Tensor]] = [[] for _ in keys]
    for log in logging_outputs:
        for i, key in enumerate(keys):
            value = log.get(key, 0.0)
            if torch.is_tensor(value):
                on_device[i].append(value.detach().reshape(()).to(device, torch.float64))
            else:
                host[i] += float(value)
    comm_device = device if device.type == "cuda" else torch.device("cpu")
    sums = to_device(torch.tensor(host, dtype=torch.float64), comm_device)
    if any(on_device):
        zero = torch.zeros((), dtype=torch.float64, device=comm_device)
        sums = sums + torch.stack([torch.stack(v).sum().to(comm_device) if v else zero for v in on_device])
    if get_world_size() > 1:
        dist.all_reduce(sums)
    return keys, sums


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without a host-device sync (pinned and copied asynchronously on CUDA)."""
    if device.type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def first_nonfinite_parameter(model: torch.nn.Module) -> str | None:
    """The name of the first parameter with an inf or NaN in what this rank holds (an FSDP shard: its local
    part), or None; one host-device sync. Combine the ranks' answers with `agree`."""
    named = list(model.named_parameters())
    local = [p.detach().to_local() if hasattr(p, "to_local") else p.detach() for _, p in named]
    if not local:
        return None
    finite = torch.stack([t.isfinite().all() for t in local])
    return None if bool(finite.all()) else named[int((~finite).nonzero()[0, 0])][0]


def broadcast_tensors(tensors: list[torch.Tensor], src: int = 0) -> None:
    """Overwrite `tensors` in place with rank `src`'s (a no-op for one process); what DDP does for the module
    it wraps, for tensors it does not see (--bf16-mode fairseq's fp32 master weights)."""
    if get_world_size() <= 1:
        return
    for t in tensors:
        dist.broadcast(t.data, src)


def agree(flags: dict[str, bool], device: torch.device) -> dict[str, bool]:
    """Each flag True on every rank when it is True on at least one: one all-reduce of a small tensor, so every
    rank takes the same decision (a stop, a save) at the same point even if only some of them saw its cause."""
    if get_world_size() <= 1:
        return dict(flags)
    keys = sorted(flags)
    buf = torch.tensor([1.0 if flags[k] else 0.0 for k in keys], dtype=torch.float32)
    buf = to_device(buf, device if device.type == "cuda" else torch.device("cpu"))
    dist.all_reduce(buf, op=dist.ReduceOp.MAX)
    return {k: v > 0 for k, v in zip(keys, buf.tolist())}


def all_gather_lists(*lists: list[Any]) -> list[list[Any]]:
    """Each list concatenated over ranks, in rank order (picklable items; for small validation outputs)."""
    if get_world_size() <= 1:
        return [list(x) for x in lists]
    gathered: list[Any] = [None] * get_world_size()
    dist.all_gather_object(gathered, [list(x) for x in lists])
    return [[item for rank_lists in gathered for item in rank_lists[i]] for i in range(len(lists))]


def clip_grad_norm_(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The total gradient L2 norm over all ranks' shards (FSDP's DTensor gradients), clipping like
    Optimizer.clip_grad_norm."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    norm = (total.full_tensor() if hasattr(total, "full_tensor") else total).float()
    if max_norm > 0:  # the clip factor stays on the device (a DTensor, as torch's clip_grad_norm_): no sync
        coef = (max_norm / (total.float() + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_(grads, coef)
    return norm


# ---------------------------------------------------------------------------------------------------- checkpoint state
def rescale_iterator_position(
    state: dict[str, Any], saved_world_size: int, world_size: int
) -> dict[str, Any]:
    """A train iterator position saved with `saved_world_size` ranks, for `world_size` ranks. Each rank takes
    one batch per step, so `iterations_in_epoch` steps consumed iterations * saved_world_size batches of the
    epoch's shared order; the new ranks continue after them."""
    offset = int(state.get("iterations_in_epoch", 0))
    if offset <= 0 or saved_world_size == world_size:
        return state
    consumed = offset * saved_world_size
    if consumed % world_size:
        logger.warning(
            f"resuming {consumed} batches into epoch {state.get('epoch')} with {world_size} ranks "
            f"(saved with {saved_world_size}): {consumed % world_size} batch(es) are trained again"
        )
    logger.info(
        f"train iterator position: {offset} steps of {saved_world_size} ranks = "
        f"{consumed // world_size} steps of {world_size}"
    )
    return {**state, "iterations_in_epoch": consumed // world_size}


def _full_options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,  # FSDP only (--ddp-backend fully_shard)
    )

    return StateDictOptions(full_state_dict=True, **kw)


def model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict (FSDP: gathered to CPU on rank 0, empty elsewhere; a collective on every rank)."""
    if not is_fsdp(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,  # FSDP only (--ddp-backend fully_shard)
    )

    return get_model_state_dict(model, options=_full_options(cpu_offload=True))


def load_model_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full state dict on every rank (FSDP keeps each rank's shard of it)."""
    if not is_fsdp(model):
        model.load_state_dict(state, strict=True)
        return
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,  # FSDP only (--ddp-backend fully_shard)
    )

    # Tied weights (BART's embeddings and output projection) are one parameter under several names; torch
    # distributes only the first name's tensor, so the aliases are left out and checked to be only aliases.
    canonical = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    result = set_model_state_dict(
        model, {k: v for k, v in state.items() if k in canonical}, options=_full_options(strict=False)
    )
    unexpected = list(result.unexpected_keys) + [k for k in model.state_dict() if k not in state]
    if unexpected or any(k in canonical for k in result.missing_keys):
        raise ValueError(
            f"state dict does not fit the sharded model: missing "
            f"{[k for k in result.missing_keys if k in canonical][:4]}, unexpected {unexpected[:4]}"
        )


def _param_names(model: torch.nn.Module, torch_optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """Per param group, the name of each optimized parameter, in the optimizer's order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in group["params"]] for group in torch_optimizer.param_groups]


def optimizer_state_dict(model: torch.nn.Module, torch_optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """torch's plain layout (state keyed by parameter index) for every backend; FSDP state is gathered to rank 0
    (empty elsewhere; a collective on every rank)."""
    if not is_fsdp(model):
        return torch_optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,  # FSDP only (--ddp-backend fully_shard)
    )

    full = get_optimizer_state_dict(model, torch_optimizer, options=_full_options(cpu_offload=True))
    if not full.get("state") and not full.get("param_groups"):
        return {}
    index = {
        name: i for i, name in enumerate(n for group in _param_names(model, torch_optimizer) for n in group)
    }
    groups = [
        {**{k: v for k, v in g.items() if k != "params"}, "params": [index[n] for n in g["params"]]}
        for g in full["param_groups"]
    ]
    return {"state": {index[name]: value for name, value in full["state"].items()}, "param_groups": groups}


def load_optimizer_state_dict(
    model: torch.nn.Module, torch_optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load torch's plain layout into an FSDP model's optimizer (every rank holds the full state)."""
    from torch.distributed.checkpoint.state_dict import (
        set_optimizer_state_dict,  # FSDP only (--ddp-backend fully_shard)
    )

    names = _param_names(model, torch_optimizer)
    flat = [n for group in names for n in group]
    if len(state["param_groups"]) != len(names) or any(
        len(g["params"]) != len(n) for g, n in zip(state["param_groups"], names)
    ):
        raise ValueError("loaded state dict has a different number of parameters or parameter groups")
    by_name = {
        "state": {flat[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [
            {**{k: v for k, v in g.items() if k != "params"}, "params": list(n)}
            for g, n in zip(state["param_groups"], names)
        ],
    }
    set_optimizer_state_dict(model, torch_optimizer, by_name, options=_full_options())
