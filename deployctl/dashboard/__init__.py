"""`deployctl dashboard`: the fleet as a live web page (the `dashboard` extra)."""
