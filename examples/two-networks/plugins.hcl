# Two clusters on two networks, reached through east-west gateways. Run
# with `estuary run -config examples/two-networks/plugins.hcl`; a client on
# network1 gets network1's endpoints plus network2's gateway in their place.
mesh {
  cluster_id = "cluster1"
  network    = "network1"
}

networks {
  network "network1" {
    endpoints {
      from_registry = "cluster1"
    }
    gateway {
      address = "127.0.0.11"
      port    = 15443
    }
  }
  network "network2" {
    endpoints {
      from_registry = "cluster2"
    }
    endpoints {
      from_cidr = "10.20.0.0/16"
    }
    gateway {
      address = "127.0.0.12"
      port    = 15443
    }
  }
}

plugin "east" {
  bundled = "static"
  config {
    cluster = "cluster1"
    service "echo.default.svc.cluster.local" {
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
      endpoint {
        address  = "127.0.0.1"
        ports    = { grpc = 50051 }
        tls_mode = "istio"
      }
    }
  }
}

plugin "west" {
  bundled = "static"
  config {
    cluster = "cluster2"
    service "echo.default.svc.cluster.local" {
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
      endpoint {
        address  = "10.20.0.5"
        ports    = { grpc = 50051 }
        tls_mode = "istio"
      }
    }
  }
}
