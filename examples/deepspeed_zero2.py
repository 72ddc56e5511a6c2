"""DeepSpeed ZeRO stage 2 (or --zero-stage 0, 1, 3) on 2 (emulated) NPUs.

DeepSpeed picks its NPU accelerator as soon as ``torch_npu`` imports and talks
``hccl``. Its NPU op builders read ``$ASCEND_HOME_PATH`` (set by CANN's
``set_env.sh`` on a real server; here ``import torch_npu`` points it at the
emulated toolkit when it is unset):

    deepspeed --num_gpus 2 examples/deepspeed_zero2.py
    torchrun --nproc-per-node 2 examples/deepspeed_zero2.py --out /tmp/zero2.json

DeepSpeed clips the global gradient norm to ``gradient_clipping`` (its default
is 1.0); ``--gradient-clipping 0`` turns that off.

ZeRO-2 partitions the optimizer state and the gradients across the ranks;
each rank keeps whole parameters, which must stay identical on every rank
(ZeRO-3 partitions the parameters as well; they are gathered for the report).
With ``--out FILE`` rank 0 writes losses and every rank's weights as JSON.
"""
import argparse
import json
import os

import torch
import torch.nn as nn

import torch_npu  # noqa: F401


def make_data(size, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 8, generator=generator)
    y = (x @ torch.linspace(-1, 1, 8)).unsqueeze(1)
    return x, y


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--zero-stage", type=int, default=2, choices=[0, 1, 2, 3])
    parser.add_argument("--gradient-clipping", type=float, default=None,
                        help="DeepSpeed's gradient_clipping (max global norm; 0 = off); default: DeepSpeed's")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    return parser.parse_args(argv)


def main(argv=None):
    import deepspeed

    args = parse_args(argv)
    deepspeed.init_distributed(dist_backend="hccl")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.npu.set_device(local_rank)
    config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.zero_stage, "reduce_bucket_size": 1000, "allgather_bucket_size": 1000},
        "steps_per_print": 10 ** 6,
    }
    if args.gradient_clipping is not None:
        config["gradient_clipping"] = args.gradient_clipping
    if args.optimizer == "adamw":
        # torch_adam: torch.optim.AdamW, not the fused CANN kernel DeepSpeed would build.
        config["optimizer"] = {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.0, "torch_adam": True}}
        optimizer = None
    else:  # a client optimizer; ZeRO only vouches for Adam-family ones
        config["zero_allow_untested_optimizer"] = True
        optimizer = "sgd"
    model = make_model(args.seed)
    if optimizer == "sgd":
        # On the device first: the emulator's Module.to("npu") still replaces the
        # Parameters, so an optimizer built on the CPU module would hold stale ones.
        model.to(torch.device("npu", local_rank))
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), optimizer=optimizer,
                                           config=config)
    x, y = make_data(args.steps * args.batch_size * world, args.seed)
    losses = []
    for step in range(args.steps):
        # Global batch `step`, this rank's slice of it.
        start = (step * world + rank) * args.batch_size
        xb, yb = x[start:start + args.batch_size].to(engine.device), y[start:start + args.batch_size].to(engine.device)
        loss = nn.functional.mse_loss(engine(xb), yb)
        engine.backward(loss)
        engine.step()
        mean_loss = loss.detach().clone()
        torch.distributed.all_reduce(mean_loss)
        losses.append(mean_loss.item() / world)
    # ZeRO-3 partitions the parameters too: gather them whole to read them.
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=args.zero_stage == 3):
        weights = torch.cat([p.detach().float().flatten() for p in engine.module.parameters()])
    gathered = [torch.empty_like(weights) for _ in range(world)]
    torch.distributed.all_gather(gathered, weights)
    report = {"world_size": world, "backend": torch.distributed.get_backend(), "device": str(engine.device),
              "accelerator": type(deepspeed.get_accelerator()).__name__, "zero_stage": engine.zero_optimization_stage(),
              "losses": losses, "weights_per_rank": [w.cpu().tolist() for w in gathered]}
    if rank == 0:
        print(f"ZeRO-{report['zero_stage']} on {world} ranks ({report['accelerator']}, {report['backend']}): "
              f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f)
    torch.distributed.destroy_process_group()
    return report


if __name__ == "__main__":
    main()
