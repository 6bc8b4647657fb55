# Two clusters on two networks, reached through east-west gateways. Run
# with `estuary run -config examples/two-networks/plugins.hcl`; a client on
# network1 (CLUSTER_ID cluster1) gets network1's endpoint 127.0.0.1:50051
# plus network2's gateway 127.0.0.12:15443 in place of 10.20.0.5, and a
# client on network2 gets 10.20.0.5:50051 plus network1's gateway
# 127.0.0.11:15443; each east-west gateway forwards to its own network's
# endpoint only. "west" (cluster2) names no network and is not
# mesh.cluster_id, so it does not inherit mesh.network: from_registry puts
# it on network2.
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
