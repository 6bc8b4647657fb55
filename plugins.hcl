# The default configuration `make run` uses: the static registry serving a
# sample echo service. Add a plugin block per registry you enable; see
# examples/ for Kubernetes multicluster, Consul and ServiceEntry setups.

mesh {
  domain_suffix = "cluster.local"
  cluster_id    = "cluster1"
  network       = "network1"
}

xds {
  listen         = "127.0.0.1:15010"
  debounce_after = "100ms"
  debounce_max   = "10s"
}

admin {
  listen = "127.0.0.1:15014"
}

plugin "static" {
  config {
    cluster = "cluster1"
    network = "network1"

    service "echo.default.svc.cluster.local" {
      namespace = "default"
      addresses = ["10.96.0.10"]
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
      endpoint {
        address  = "127.0.0.1"
        ports    = { grpc = 50051 }
        labels   = { app = "echo", version = "v1" }
        locality = "us-east1/us-east1-b"
        weight   = 1
        tls_mode = "istio"
      }
      endpoint {
        address  = "127.0.0.1"
        name     = "echo-v2"
        ports    = { grpc = 50052 }
        labels   = { app = "echo", version = "v2" }
        locality = "us-east1/us-east1-c"
        weight   = 1
      }
    }

    gateway {
      network = "network1"
      address = "127.0.0.1"
      port    = 15443
    }
  }
}
