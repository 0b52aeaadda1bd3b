"""Discrete-event simulation of a serving engine around the schedir runtime.

Arrivals from a workload go to `Scheduler.schedule()`; a cost model measured on
real GPUs turns each batch plan into a step time; `update()` gets the generated
tokens; per-request and per-step metrics are collected for `schedir sim/bench`.
"""
