"""CUDA tensors handed to a child process through torch.multiprocessing (CUDA IPC): the
child adds to the parent's tensor in place and sends one back; the parent checks both."""
import torch
import torch.multiprocessing as mp

from common import Steps, report, seed


def child(q_in, q_out):
    t = q_in.get()
    t.add_(1.0)
    torch.cuda.synchronize()
    out = torch.full((1 << 20,), 2.0, device="cuda")
    q_out.put((float(t.sum().item()), out))
    q_in.get()  # the parent is done with `out`


if __name__ == "__main__":
    mp.set_start_method("spawn")
    seed()
    q_in, q_out = mp.Queue(), mp.Queue()
    p = mp.Process(target=child, args=(q_in, q_out))
    p.start()
    steps = Steps()
    with steps:
        t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        q_in.put(t)
        child_sum, out = q_out.get(timeout=120)
        torch.cuda.synchronize()
    steps.loss(child_sum)
    steps.loss(t.sum().item())
    steps.loss(out.sum().item())
    q_in.put(None)
    p.join(timeout=60)
    report(steps, child_exit=p.exitcode)
