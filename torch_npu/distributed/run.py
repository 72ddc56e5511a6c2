"""``torch_npu_run``: the launcher; forwards to torchrun."""


def _main(args=None):
    from torch.distributed.run import main
    main(args)


if __name__ == "__main__":
    _main()
