"""One module per benchmark scenario, named as its JSON's "scenario": ROW_FIELDS (what
every row holds, checked by check_results.py), render(result, plot_dir) -> Markdown lines,
and optionally check(result) -> problems beyond the rows' shape."""
