"""Analysis over run records and traces: reports, trace plots, energy diagnosis (`joulebench VERB`).

It reads what drivers and the meter wrote; it never imports a driver, and no driver imports it.
"""
