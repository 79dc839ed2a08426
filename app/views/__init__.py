"""The app's panels: each a QWidget built from the app context (`app.runtime.context.AppContext`)."""
