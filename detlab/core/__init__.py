"""The core both sides import: config schema, wire types, collective maths, log parser, verdicts.

Pure: imports neither the server stack nor torch."""
