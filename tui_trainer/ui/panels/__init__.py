"""The dashboard's panels, one module each. A panel draws what the app's snapshot holds
(`show(...)`), owns its keys, and tells the app what the user asked for with typed messages;
none of them touches the session store."""
