package static

import (
	"slices"
	"strings"
	"testing"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

const echoConfig = `
cluster = "cluster1"
network = "network1"
service "echo.default.svc.cluster.local" {
  namespace = "default"
  addresses = ["10.0.0.10"]
  mtls_mode = "DISABLE"
  port "grpc" {
    number   = 8080
    protocol = "GRPC"
  }
  endpoint {
    address  = "127.0.0.1"
    ports    = { grpc = 50051 }
    labels   = { version = "v1" }
    locality = "us-east1/us-east1-b"
    weight   = 3
    tls_mode = "istio"
  }
  endpoint {
    address = "127.0.0.2"
    network = "network2"
  }
}
gateway {
  network = "network1"
  address = "1.1.1.1"
  port    = 15443
}
`

func TestConformance(t *testing.T) {
	sdktest.Run(t, sdktest.Suite{
		Factory:  Factory,
		Config:   echoConfig,
		Reconfig: strings.Replace(echoConfig, `"127.0.0.2"`, `"127.0.0.3"`, 1),
		Check: func(t testing.TB, r *sdktest.Replica) {
			in := r.Instance(sdk.ProviderStatic, "cluster1")
			if in == nil {
				t.Fatalf("no Static/cluster1 instance; have %s", r)
			}
			if in.Properties.DefaultNetwork != "network1" || in.Properties.ClusterScoped {
				t.Errorf("properties = %+v, want default network network1, not cluster scoped", in.Properties)
			}
			svc := in.Services["echo.default.svc.cluster.local"]
			if svc == nil {
				t.Fatalf("echo service missing")
			}
			if want := []sdk.Port{{Name: "grpc", Number: 8080, Protocol: "GRPC"}}; !slices.Equal(svc.Ports, want) {
				t.Errorf("ports = %v, want %v", svc.Ports, want)
			}
			if svc.MTLSMode != sdk.MTLSModeDisable || svc.MTLSModeSource != "attribute mtls_mode" {
				t.Errorf("mTLS mode %q from %q, want DISABLE from attribute mtls_mode", svc.MTLSMode, svc.MTLSModeSource)
			}
			if got := svc.VIPs["cluster1"]; !slices.Equal(got, []string{"10.0.0.10"}) {
				t.Errorf("VIPs = %v", svc.VIPs)
			}
			eps := in.Endpoints["echo.default.svc.cluster.local"]
			if len(eps) != 2 {
				t.Fatalf("endpoints = %+v, want 2", eps)
			}
			e := eps[0]
			if e.Address != "127.0.0.1" || e.TargetPorts["grpc"] != 50051 || e.Labels["version"] != "v1" ||
				e.Locality != (sdk.Locality{Region: "us-east1", Zone: "us-east1-b"}) || e.Weight != 3 || e.TLSMode != sdk.TLSModeIstio {
				t.Errorf("endpoint 0 = %+v", e)
			}
			if eps[1].Network != "network2" {
				t.Errorf("endpoint 1 network = %q, want network2", eps[1].Network)
			}
			if len(in.Gateways) != 1 || in.Gateways[0] != (sdk.NetworkGateway{Network: "network1", Cluster: "cluster1", Address: "1.1.1.1", Port: 15443}) {
				t.Errorf("gateways = %+v", in.Gateways)
			}
		},
	})
}

func TestValidation(t *testing.T) {
	tests := []struct {
		name, config string
		wantPath     []string
		wantMsg      string
	}{
		{"bad port", `service "a.b" {
  port "http" { number = 70000 }
}`, []string{"service", "0", "port", "0", "number"}, "not between 1 and 65535"},
		{"endpoint maps unknown port", `service "a.b" {
  port "http" { number = 80 }
  endpoint {
    address = "10.0.0.1"
    ports = { grpc = 9000 }
  }
}`, []string{"service", "0", "endpoint", "0", "ports"}, `does not declare`},
		{"hostname address with static resolution", `service "a.b" {
  endpoint { address = "backend.example.com" }
}`, []string{"service", "0", "endpoint", "0", "address"}, "not an IP address"},
		{"bad tls mode", `service "a.b" {
  endpoint {
    address = "10.0.0.1"
    tls_mode = "mutual"
  }
}`, []string{"service", "0", "endpoint", "0", "tls_mode"}, "unknown TLS mode"},
		{"bad resolution", `service "a.b" {
  resolution = "MAGIC"
}`, []string{"service", "0", "resolution"}, "unknown resolution"},
		{"bad mtls mode", `service "a.b" {
  mtls_mode = "ISTIO_MUTUAL"
}`, []string{"service", "0", "mtls_mode"}, `mtls_mode "ISTIO_MUTUAL" is not one of STRICT, PERMISSIVE, DISABLE`},
		{"empty mtls mode", `service "a.b" {
  mtls_mode = ""
}`, []string{"service", "0", "mtls_mode"}, `is not one of`},
		{"bad gateway port", `gateway {
  network = "n"
  address = "1.2.3.4"
  port = 0
}`, []string{"gateway", "0", "port"}, "not between"},
		{"duplicate service", `service "a.b" {}
service "a.b" {}`, []string{"service", "1"}, "declared twice"},
		{"unknown protocol", `service "a.b" {
  port "web" {
    number   = 80
    protocol = "QUIC"
  }
}`, []string{"service", "0", "port", "0", "protocol"}, `unknown protocol "QUIC"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			js, diags := configschema.ParseHCL("t.hcl", []byte(tt.config), schema)
			if diags.HasErrors() {
				t.Fatalf("schema decode: %v", diags)
			}
			var cfg config
			req := &sdk.ConfigureRequest{ConfigJSON: js}
			if err := req.Decode(&cfg); err != nil {
				t.Fatal(err)
			}
			_, _, _, _, ds := build(&cfg, sdk.MeshSettings{ClusterID: "c1"}, nil)
			for _, d := range ds {
				if slices.Equal(d.Path, tt.wantPath) && strings.Contains(d.Summary, tt.wantMsg) {
					return
				}
			}
			t.Errorf("diagnostics %+v lack %q at %v", ds, tt.wantMsg, tt.wantPath)
		})
	}
}

// TestProtocolSpelling: port protocols are read as Istio reads them (any
// case) and reported in Istio's spelling.
func TestProtocolSpelling(t *testing.T) {
	for in, want := range map[string]string{"http": "HTTP", "grpc-web": "GRPC-Web", "Http_Proxy": "HTTP_PROXY", "": "TCP"} {
		src := "service \"a.b\" {\n  port \"p\" {\n    number = 80\n"
		if in != "" {
			src += "    protocol = \"" + in + "\"\n"
		}
		js, diags := configschema.ParseHCL("t.hcl", []byte(src+"  }\n}\n"), schema)
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		var cfg config
		if err := (&sdk.ConfigureRequest{ConfigJSON: js}).Decode(&cfg); err != nil {
			t.Fatal(err)
		}
		_, _, snap, _, ds := build(&cfg, sdk.MeshSettings{ClusterID: "c1"}, nil)
		if ds.HasErrors() || snap.Services[0].Ports[0].Protocol != want {
			t.Errorf("protocol %q: got %v (%v), want %q", in, snap.Services[0].Ports, ds, want)
		}
	}
}

func TestConfigureHonoursContext(t *testing.T) {
	p, _ := sdktest.Direct(t, Factory)
	sdktest.ConfigureHonoursContext(t, p, &sdk.ConfigureRequest{ConfigJSON: []byte(`{"cluster": "c1"}`)})
}

// TestRebuildTakesOnlyWhatIsUnchanged: a reconfigure takes an unchanged
// service from the previous build, but not one built for another
// cluster, and never one that had problems.
func TestRebuildTakesOnlyWhatIsUnchanged(t *testing.T) {
	decode := func(src string) *config {
		t.Helper()
		js, diags := configschema.ParseHCL("t.hcl", []byte(src), schema)
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		var cfg config
		if err := (&sdk.ConfigureRequest{ConfigJSON: js}).Decode(&cfg); err != nil {
			t.Fatal(err)
		}
		return &cfg
	}
	const svc = `service "a.b" {
  addresses = ["10.0.0.1"]
  endpoint { address = "10.1.0.1" }
}
`
	_, _, snap1, built, ds := build(decode("cluster = \"c1\"\n"+svc), sdk.MeshSettings{}, nil)
	if ds.HasErrors() || len(built.services) != 1 {
		t.Fatalf("first build: %v, %d kept", ds, len(built.services))
	}
	_, _, snap2, built, _ := build(decode("cluster = \"c1\"\n"+svc+`service "c.d" {}`), sdk.MeshSettings{}, built)
	if snap2.Services[0] != snap1.Services[0] {
		t.Error("the unchanged service was built again")
	}
	_, _, snap3, _, _ := build(decode("cluster = \"c2\"\n"+svc), sdk.MeshSettings{}, built)
	if vips := snap3.Services[0].VIPs; len(vips["c2"]) != 1 || len(vips["c1"]) != 0 {
		t.Errorf("VIPs after the cluster changed = %v, want them under c2", vips)
	}
	bad := "cluster = \"c1\"\nservice \"a.b\" {\n  mtls_mode = \"SOMETIMES\"\n}\n"
	_, _, _, built, ds = build(decode(bad), sdk.MeshSettings{}, nil)
	if !ds.HasErrors() {
		t.Fatal("bad mtls_mode accepted")
	}
	if _, _, _, _, ds = build(decode(bad), sdk.MeshSettings{}, built); !ds.HasErrors() {
		t.Error("a service with problems was taken from the previous build")
	}
}
