"""The `joulebench` verbs over run records and traces: report, plot, plan, recommend, attribute, doctor and demo.

It reads what drivers and the meter wrote; it never imports a driver, and no driver imports it. Its run layer
(runs: finding, reading and version-checking records) lies under every verb; no import circle joins its modules.
"""
