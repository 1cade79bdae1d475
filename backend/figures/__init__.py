"""Plotly figures per job kind, built in Python."""
