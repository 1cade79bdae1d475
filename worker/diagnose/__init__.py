"""Diagnosis measurements that touch torch: batch invariance of ops and models, and the op audit of a step."""
