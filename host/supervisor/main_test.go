package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/sdk"
)

// The test binary doubles as a plugin: run with ESTUARY_TEST_PLUGIN=MODE it
// serves a plugin instead of running tests, so the supervisor is tested
// against real plugin processes.
func TestMain(m *testing.M) {
	if mode := os.Getenv("ESTUARY_TEST_PLUGIN"); mode != "" {
		servePlugin(mode)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func servePlugin(mode string) {
	switch mode {
	case "bench":
		sdk.Serve(benchFactory)
	case "ok":
		sdk.Serve(okFactory)
	case "env":
		// Writes its environment to $ESTUARY_TEST_ENV_OUT, then serves.
		if err := os.WriteFile(os.Getenv("ESTUARY_TEST_ENV_OUT"), []byte(strings.Join(os.Environ(), "\n")), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		sdk.Serve(okFactory)
	case "ok-restart":
		// Takes a new block only by a restart.
		sdk.Serve(func(rt sdk.Runtime) sdk.Plugin { return &okPlugin{rt: rt, noReconfigure: true} })
	case "ok-blocking":
		// Its first Configure creates $ESTUARY_TEST_ENTERED, then returns
		// only once $ESTUARY_TEST_RELEASE exists: the test applies a block
		// while the plugin is starting.
		sdk.Serve(func(rt sdk.Runtime) sdk.Plugin {
			return &okPlugin{rt: rt, entered: os.Getenv("ESTUARY_TEST_ENTERED"), release: os.Getenv("ESTUARY_TEST_RELEASE")}
		})
	case "stdout":
		// Anything on stdout before the handshake line breaks go-plugin.
		fmt.Println("hello from a plugin that prints to stdout")
		sdk.Serve(okFactory)
	case "cookie":
		// A plugin built for another host expects another cookie.
		goplugin.Serve(&goplugin.ServeConfig{
			HandshakeConfig: goplugin.HandshakeConfig{ProtocolVersion: 1, MagicCookieKey: "OTHER_HOST_PLUGIN", MagicCookieValue: "other"},
			Plugins:         goplugin.PluginSet{sdk.PluginName: &sdk.GRPCPlugin{}},
			GRPCServer:      goplugin.DefaultGRPCServer,
		})
	case "version":
		// A plugin that only speaks a future protocol version.
		hs := sdk.Handshake
		hs.ProtocolVersion = 99
		goplugin.Serve(&goplugin.ServeConfig{
			HandshakeConfig:  hs,
			VersionedPlugins: map[int]goplugin.PluginSet{99: {sdk.PluginName: &sdk.GRPCPlugin{}}},
			GRPCServer:       goplugin.DefaultGRPCServer,
		})
	case "gateways":
		sdk.Serve(func(rt sdk.Runtime) sdk.Plugin { return &gatewaysPlugin{rt: rt} })
	case "gateways-declared":
		sdk.Serve(func(rt sdk.Runtime) sdk.Plugin { return &gatewaysPlugin{rt: rt, declare: true} })
	case "gateways-late":
		sdk.Serve(func(rt sdk.Runtime) sdk.Plugin { return &gatewaysPlugin{rt: rt, late: 200 * time.Millisecond} })
	case "set":
		sdk.Serve(func(rt sdk.Runtime) sdk.Plugin { return &setPlugin{rt: rt} })
	case "crash":
		fmt.Fprintln(os.Stderr, "crashing on purpose")
		os.Exit(1)
	case "panic":
		sdk.Serve(func(rt sdk.Runtime) sdk.Plugin { return panicPlugin{} })
	default:
		fmt.Fprintf(os.Stderr, "unknown test plugin mode %q\n", mode)
		os.Exit(2)
	}
}

// selfPlugin is a plugin block that runs this test binary in mode.
func selfPlugin(t testing.TB, label, mode, body string) *config.Plugin {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return &config.Plugin{
		Label:       label,
		Path:        self,
		SHA256:      fileSHA256(t, self),
		Env:         map[string]string{"ESTUARY_TEST_PLUGIN": mode},
		Config:      parseBody(t, body),
		SyncTimeout: config.DefaultSyncTimeout,
	}
}

func parseBody(t testing.TB, src string) hcl.Body {
	t.Helper()
	f, diags := hclsyntax.ParseConfig([]byte(src), "test.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return f.Body
}

func fileSHA256(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// benchFactory publishes `batches` sets of `size` endpoints spread
// round-robin over `services` services, all before the host watches, so the
// stream carries them as fast as the boundary allows.
func benchFactory(rt sdk.Runtime) sdk.Plugin { return &benchPlugin{rt: rt} }

type benchPlugin struct{ rt sdk.Runtime }

func (p *benchPlugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Name: "bench", Version: "test", Capabilities: []sdk.Capability{sdk.CapabilityReconfigure},
		ConfigSchema: &sdk.Schema{Attributes: []sdk.Attribute{
			{Name: "batches", Type: "number", Required: true},
			{Name: "size", Type: "number", Required: true},
			{Name: "services", Type: "number", Required: true},
		}}}, nil
}

func (p *benchPlugin) Configure(_ context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	var cfg struct{ Batches, Size, Services int }
	if err := req.Decode(&cfg); err != nil {
		return nil, err
	}
	id := sdk.InstanceID{Provider: "Bench", Cluster: "c1"}
	st := p.rt.State
	st.SetInstance(id, sdk.InstanceProperties{DefaultNetwork: "n1"})
	hosts := make([]string, cfg.Services)
	for i := range hosts {
		hosts[i] = "svc" + strconv.Itoa(i) + ".bench.svc.cluster.local"
		_ = st.UpsertService(id, &sdk.Service{Hostname: hosts[i], Namespace: "bench", Ports: []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}}})
	}
	_ = st.MarkSynced(id)
	// Two variants that differ in every endpoint's weight, alternated so
	// every update is a real change; State keeps slices as immutable, so
	// they can be shared.
	variants := [2][]sdk.Endpoint{benchEndpoints(cfg.Size, 1), benchEndpoints(cfg.Size, 2)}
	for i := range cfg.Batches {
		eps := variants[(i/len(hosts))%2]
		if err := st.SetEndpoints(id, hosts[i%len(hosts)], eps); err != nil {
			return nil, err
		}
	}
	return &sdk.ConfigureResponse{}, nil
}

// benchEndpoints are realistic Kubernetes-like endpoints: two labels, a
// named target port, locality, network, service account, TLS mode.
func benchEndpoints(n int, weight uint32) []sdk.Endpoint {
	eps := make([]sdk.Endpoint, n)
	labels := map[string]string{"app": "bench", "version": "v1"}
	ports := map[string]uint32{"http": 8080}
	for i := range eps {
		eps[i] = sdk.Endpoint{
			Address:        fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
			TargetPorts:    ports,
			Labels:         labels,
			Network:        "network1",
			Locality:       sdk.Locality{Region: "us-east1", Zone: "us-east1-b"},
			TLSMode:        sdk.TLSModeIstio,
			Weight:         weight,
			ServiceAccount: "spiffe://cluster.local/ns/bench/sa/bench",
			WorkloadName:   fmt.Sprintf("bench-%d", i),
		}
	}
	return eps
}

// okFactory reports one instance with one service, and rejects a config
// whose `port` is out of range, with a path the host maps to a position.
func okFactory(rt sdk.Runtime) sdk.Plugin { return &okPlugin{rt: rt} }

type okPlugin struct {
	rt            sdk.Runtime
	noReconfigure bool
	// entered and release, when set, hold the first Configure: see
	// "ok-blocking".
	entered, release string
	configured       bool
}

func (p *okPlugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	var caps []sdk.Capability
	if !p.noReconfigure {
		caps = append(caps, sdk.CapabilityReconfigure)
	}
	return &sdk.DescribeResponse{Name: "ok", Version: "1.2.3", Capabilities: caps,
		ConfigSchema: &sdk.Schema{Attributes: []sdk.Attribute{{Name: "port", Type: "number"}}}}, nil
}

func (p *okPlugin) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	if p.release != "" && !p.configured {
		if err := os.WriteFile(p.entered, nil, 0o600); err != nil {
			return nil, err
		}
		for {
			if _, err := os.Stat(p.release); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	p.configured = true
	var cfg struct{ Port *float64 }
	if err := req.Decode(&cfg); err != nil {
		return nil, err
	}
	port := uint32(80)
	if cfg.Port != nil {
		if *cfg.Port < 1 || *cfg.Port > 65535 {
			var d sdk.Diagnostics
			d.Errorf([]string{"port"}, "port %v is not between 1 and 65535", *cfg.Port)
			return &sdk.ConfigureResponse{Diagnostics: d}, nil
		}
		port = uint32(*cfg.Port)
	}
	id := sdk.InstanceID{Provider: "Test", Cluster: "c1"}
	p.rt.State.SetInstance(id, sdk.InstanceProperties{})
	_ = p.rt.State.UpsertService(id, &sdk.Service{Hostname: "ok.test", Ports: []sdk.Port{{Name: "http", Number: port, Protocol: "HTTP"}}})
	_ = p.rt.State.MarkSynced(id)
	return &sdk.ConfigureResponse{}, nil
}

type panicPlugin struct{}

func (panicPlugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	panic("describe exploded")
}

func (panicPlugin) Configure(context.Context, *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	return &sdk.ConfigureResponse{}, nil
}

// gatewaysPlugin reports one instance with a service and a network gateway.
// Unless declare is set it does not declare CAPABILITY_GATEWAYS, which the
// host must refuse.
type gatewaysPlugin struct {
	rt      sdk.Runtime
	declare bool
	// late, when set, publishes the gateways only this long after the
	// instance has synced, so the host first sees a healthy stream.
	late time.Duration
}

func (p *gatewaysPlugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	caps := []sdk.Capability{sdk.CapabilityReconfigure}
	if p.declare {
		caps = append(caps, sdk.CapabilityGateways)
	}
	return &sdk.DescribeResponse{Name: "gateways", Version: "1", Capabilities: caps}, nil
}

func (p *gatewaysPlugin) Configure(context.Context, *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	id := sdk.InstanceID{Provider: "Test", Cluster: "c1"}
	st := p.rt.State
	st.SetInstance(id, sdk.InstanceProperties{})
	if err := st.UpsertService(id, &sdk.Service{Hostname: "ok.test", Ports: []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}}}); err != nil {
		return nil, err
	}
	gws := []sdk.NetworkGateway{{Network: "n1", Cluster: "c1", Address: "192.0.2.1", Port: 15443}}
	if p.late > 0 {
		time.AfterFunc(p.late, func() { _ = st.SetGateways(id, gws) })
		return &sdk.ConfigureResponse{}, st.MarkSynced(id)
	}
	if err := st.SetGateways(id, gws); err != nil {
		return nil, err
	}
	return &sdk.ConfigureResponse{}, st.MarkSynced(id)
}

// setPlugin declares CAPABILITY_INSTANCE_SET and reports one instance; it
// declares its instance set complete only if its config says `complete =
// true`.
type setPlugin struct{ rt sdk.Runtime }

func (p *setPlugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Name: "set", Version: "1", Capabilities: []sdk.Capability{sdk.CapabilityInstanceSet},
		ConfigSchema: &sdk.Schema{Attributes: []sdk.Attribute{{Name: "complete", Type: "bool"}}}}, nil
}

func (p *setPlugin) Configure(_ context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	var cfg struct{ Complete *bool }
	if err := req.Decode(&cfg); err != nil {
		return nil, err
	}
	id := sdk.InstanceID{Provider: "Test", Cluster: "c1"}
	p.rt.State.SetInstance(id, sdk.InstanceProperties{})
	if cfg.Complete != nil && *cfg.Complete {
		p.rt.State.InstanceSetComplete()
	}
	return &sdk.ConfigureResponse{}, p.rt.State.MarkSynced(id)
}
