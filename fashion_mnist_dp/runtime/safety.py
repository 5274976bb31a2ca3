"""The run's guarantees in one callback: a fault of the job ends it in one line and a hang report; divergence stops
every rank at one step; a signal stops them at one step with a verified last.ckpt; the ranks decide these together
at decision points, every ``check_every_n_steps`` steps; a resume draws what the uninterrupted run would have
(docs/reliability.md). Its parts run in this order, which exists for a reason: JobFaults' exception hook first (no
collective save with a rank that is gone), divergence before preemption (a diverged run saves nothing), both before
the Agreement that decides for them."""

from callbacks.owner import Owner
from fashion_mnist_dp.runtime.agreement import DEFAULT_CHECK_EVERY_N_STEPS, Agreement, TrainingLoss
from fashion_mnist_dp.runtime.divergence import DivergenceGuard
from fashion_mnist_dp.runtime.faults import JobFaults
from fashion_mnist_dp.runtime.resume import RngState
from fashion_mnist_dp.runtime.signals import Preemption


class RunSafety(Owner):
    """Each guarantee a part, named by a key (false: left out, and the start block's ``safety off`` line says what is
    lost). ``check_every_n_steps``: train.py's key of that name sets it."""

    def __init__(self, check_every_n_steps: int = DEFAULT_CHECK_EVERY_N_STEPS, job_faults: bool = True,
                 divergence: bool = True, preemption: bool = True, exact_resume: bool = True) -> None:
        agreement = Agreement(check_every_n_steps)
        super().__init__([JobFaults() if job_faults else None, DivergenceGuard() if divergence else None,
                          Preemption() if preemption else None, TrainingLoss(), agreement,
                          RngState() if exact_resume else None])
        agreement.owned = [part for part in self.parts if part is not agreement]
