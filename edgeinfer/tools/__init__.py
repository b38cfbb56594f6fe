"""Measuring tools that stand apart from the core: bench, loadbench, eval, plan, doctor."""
