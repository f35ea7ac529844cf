"""Discrete-event pipeline simulator: engine, schedules, op DAG of a plan, trace and Gantt export."""
from milp_plan.sim.from_plan import simulate_plan, spec_from_plan
from milp_plan.sim.pipeline import OpRecord, PathTerms, PipelineSpec, SimResult, simulate_pipeline
from milp_plan.schedules import NAMES as SIM_SCHEDULES, Action, device_orders, schedule_of

__all__ = ["Action", "OpRecord", "PathTerms", "PipelineSpec", "SimResult", "SIM_SCHEDULES", "device_orders", "simulate_pipeline",
           "simulate_plan", "spec_from_plan"]

SIM_MAX_OPERATIONS = 500_000  # a plan with more pipeline operations is not simulated event by event


def operation_count(plan) -> int:
    """Forward and backward operations the simulator would run for one step of `plan`
    (three per micro-batch and chunk under ZB-H1, which splits the backward)."""
    n = schedule_of(plan.schedule, int(plan.vpp)).operations(int(plan.pp), int(plan.num_microbatches))
    return n * max(1, len(plan.slices))   # token slices: one operation per slice


def too_large_to_simulate(plan) -> str | None:
    """Why `plan` is not simulated event by event (too many operations), or None."""
    n = operation_count(plan)
    if n <= SIM_MAX_OPERATIONS:
        return None
    return (f"not simulated: {n:.3g} pipeline operations exceed the simulator's limit of {SIM_MAX_OPERATIONS:,} "
            "(milp_plan.sim.SIM_MAX_OPERATIONS); the closed form stands alone")
