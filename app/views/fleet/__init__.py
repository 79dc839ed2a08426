"""The fleet views: many servers side by side, every block of the fleet in one table, the
blocks held twice, where a prefix lives, and the router's view of a probe prompt.

`FleetView` (app.views.fleet.fleet_view) is the dock panel; it draws the plain values of
`engine.remote.fleet_view`, read through `ctx.remote` (live, or a recorded capture).
"""
