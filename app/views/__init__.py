"""The app's panels: each a QWidget built from the app context (`app.context.AppContext`)."""
