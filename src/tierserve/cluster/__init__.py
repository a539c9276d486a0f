"""Scale-out on Ray Serve: an ingress deployment (the api/ app over a RemoteEngine), N engine
replicas (one AsyncEngine each) behind a priority-aware request router, a fleet board, and a
class-aware autoscaling policy. See docs/scale-out.md.

The modules that import Ray are ``router``, ``engine_replica``, ``ingress``, ``board`` and
``launch`` (lazily); ``wire``, ``fleet``, ``signals``, ``autoscale``, ``local_load``, ``observe``
and ``remote_engine`` are plain Python, tested without Ray."""
