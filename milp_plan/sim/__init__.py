"""Discrete-event pipeline simulator: engine, schedules, op DAG of a plan, trace and Gantt export."""
from milp_plan.sim.pipeline import OpRecord, PipelineSpec, SimResult, simulate_pipeline, simulate_plan, spec_from_plan
from milp_plan.sim.schedules import SIM_SCHEDULES, Action, device_orders

__all__ = ["Action", "OpRecord", "PipelineSpec", "SimResult", "SIM_SCHEDULES", "device_orders", "simulate_pipeline",
           "simulate_plan", "spec_from_plan"]
