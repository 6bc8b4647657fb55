package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestProxylessClientReachesServiceEntryBackends: backends declared by an
// Istio ServiceEntry with STATIC resolution, served by the bundled
// serviceentry plugin, are reached by a grpc-go xDS client.
func TestProxylessClientReachesServiceEntryBackends(t *testing.T) {
	b1, b2 := startBackend(t, "se-1"), startBackend(t, "se-2")
	dir := t.TempDir()
	se := fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: legacy-echo
  namespace: default
spec:
  hosts:
  - legacy-echo.example.com
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - number: 8080
    name: grpc
    protocol: GRPC
  endpoints:
  - address: 127.0.0.1
    ports:
      grpc: %d
    locality: us-east1/us-east1-b
  - address: 127.0.0.1
    ports:
      grpc: %d
    locality: us-east1/us-east1-b
`, b1.port, b2.port)
	if err := os.WriteFile(filepath.Join(dir, "legacy.yaml"), []byte(se), 0o644); err != nil {
		t.Fatal(err)
	}
	h := startHost(t, fmt.Sprintf(`plugin "serviceentry" {
  config {
    dir        = %q
    cluster_id = "cluster1"
    network    = "network1"
  }
}
`, dir))
	c := xdsClient(t, h.xds, "sidecar~127.0.0.1~se-client.default~default.svc.cluster.local", "legacy-echo.example.com:8080")
	waitServedBy(t, c, "se-1", "se-2")
}
