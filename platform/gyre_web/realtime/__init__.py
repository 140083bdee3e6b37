"""The websocket side: one consumer serving run event streams and the cluster stream."""
