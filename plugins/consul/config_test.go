package consul

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
)

// decodeConfig decodes an HCL body as the host does and parses it.
func decodeConfig(t *testing.T, hcl string, mesh sdk.MeshSettings) (*settings, sdk.Diagnostics) {
	t.Helper()
	js, diags := configschema.ParseHCL("plugins.hcl", []byte(hcl), schema)
	if diags.HasErrors() {
		t.Fatalf("schema decode: %v", diags)
	}
	var cfg config
	if err := (&sdk.ConfigureRequest{ConfigJSON: js}).Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	return parseConfig(&cfg, mesh)
}

func TestConfigDefaults(t *testing.T) {
	for _, k := range []string{"CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_HTTP_SSL", "CONSUL_NAMESPACE", "CONSUL_PARTITION", "CONSUL_CACERT"} {
		t.Setenv(k, "")
	}
	s, diags := decodeConfig(t, ``, sdk.MeshSettings{Network: "mesh-net"})
	if diags.HasErrors() {
		t.Fatalf("empty config rejected: %v", diags)
	}
	if s.api.Address != "localhost:8500" || s.api.Scheme != "http" || s.tls != nil {
		t.Errorf("address %q scheme %q tls %v, want the local agent over plain HTTP", s.api.Address, s.api.Scheme, s.tls)
	}
	if s.domainSuffix != "service.consul" || !slices.Equal(s.namespaces, []string{"default"}) || !slices.Equal(s.partitions, []string{"default"}) || s.warning || s.network != "" || s.mesh.Network != "mesh-net" ||
		s.waitTime != 5*time.Minute || s.rateLimit != 1000 || s.maxWatchers != 1000 || len(s.datacenters) != 0 {
		t.Errorf("defaults = %+v", s)
	}
}

func TestConfigEnvironment(t *testing.T) {
	t.Setenv("CONSUL_HTTP_ADDR", "10.9.9.9:8501")
	t.Setenv("CONSUL_HTTP_TOKEN", "env-token")
	s, diags := decodeConfig(t, ``, sdk.MeshSettings{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if s.api.Address != "10.9.9.9:8501" || s.token != "env-token" {
		t.Errorf("address %q token set %v: the consul CLI's environment should be the default", s.api.Address, s.token == "env-token")
	}
	s, _ = decodeConfig(t, `token = "cfg-token"`, sdk.MeshSettings{})
	if s.token != "cfg-token" {
		t.Errorf("an explicit token does not replace the environment's")
	}
}

func TestConfigFull(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("  s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, diags := decodeConfig(t, `
address       = "consul.example:8500"
datacenters   = ["dc1", "dc2"]
token_file    = "`+tokenFile+`"
namespace     = "team-a"
partition     = "p1"
domain_suffix = ".consul.example."
health        = "passing_and_warning"
tag_filter    = ["mesh", "prod"]
network       = "net1"
wait_time     = "30s"
rate_limit    = 50
max_watchers  = 20
`, sdk.MeshSettings{Network: "mesh-net"})
	if diags.HasErrors() {
		t.Fatalf("rejected: %v", diags)
	}
	if s.token != "s3cr3t" || s.tokenFile != tokenFile {
		t.Errorf("token from file not read and trimmed")
	}
	if !slices.Equal(s.datacenters, []string{"dc1", "dc2"}) || !slices.Equal(s.namespaces, []string{"team-a"}) ||
		!slices.Equal(s.partitions, []string{"p1"}) || s.api.Namespace != "" || s.api.Partition != "" || s.domainSuffix != "consul.example" || !s.warning ||
		!slices.Equal(s.tagFilter, []string{"mesh", "prod"}) || s.network != "net1" || s.waitTime != 30*time.Second ||
		s.rateLimit != 50 || s.maxWatchers != 20 {
		t.Errorf("settings = %+v", s)
	}
}

func TestConfigValidation(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	notPEM := filepath.Join(dir, "ca.pem")
	for _, f := range []string{empty, notPEM} {
		if err := os.WriteFile(f, []byte("\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name, config string
		path         []string
		msg          string
	}{
		{"empty address", `address = " "`, []string{"address"}, "must not be empty"},
		{"bad scheme", `scheme = "ftp"`, []string{"scheme"}, `"ftp" is not`},
		{"empty datacenter", `datacenters = ["dc1", ""]`, []string{"datacenters", "1"}, "must not be empty"},
		{"duplicate datacenter", `datacenters = ["dc1", "dc1"]`, []string{"datacenters", "1"}, "listed twice"},
		{"token and token_file", "token = \"a\"\ntoken_file = \"" + empty + "\"", []string{"token_file"}, "not both"},
		{"missing token file", `token_file = "/nonexistent/token"`, []string{"token_file"}, "no such file"},
		{"empty token file", `token_file = "` + empty + `"`, []string{"token_file"}, "is empty"},
		{"TLS over http", `ca_file = "` + notPEM + `"`, []string{"scheme"}, `set scheme = "https"`},
		{"CA file without PEM", "scheme = \"https\"\nca_file = \"" + notPEM + "\"", []string{"ca_file"}, "no PEM certificate"},
		{"missing CA file", "scheme = \"https\"\nca_file = \"/nonexistent/ca.pem\"", []string{"ca_file"}, "no such file"},
		{"cert without key", "scheme = \"https\"\ncert_file = \"" + notPEM + "\"", []string{"key_file"}, "without key_file"},
		{"bad key pair", "scheme = \"https\"\ncert_file = \"" + notPEM + "\"\nkey_file = \"" + notPEM + "\"", []string{"cert_file"}, "load client certificate"},
		{"bad domain suffix", `domain_suffix = "."`, []string{"domain_suffix"}, "not a DNS suffix"},
		{"bad health", `health = "warning"`, []string{"health"}, `"warning" is not "passing" or "passing_and_warning"`},
		{"empty tag", `tag_filter = ["a", ""]`, []string{"tag_filter", "1"}, "must not be empty"},
		{"wait_time too long", `wait_time = "11m"`, []string{"wait_time"}, "not between 1s and 10m0s"},
		{"zero rate", `rate_limit = 0`, []string{"rate_limit"}, "above 0"},
		{"fractional watchers", `max_watchers = 1.5`, []string{"max_watchers"}, "whole number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, diags := decodeConfig(t, tt.config, sdk.MeshSettings{})
			for _, d := range diags {
				if slices.Equal(d.Path, tt.path) && strings.Contains(d.Summary, tt.msg) && d.Severity == sdk.SeverityError {
					return
				}
			}
			t.Errorf("diagnostics %+v lack %q at %v", diags, tt.msg, tt.path)
		})
	}
}

// TestConfigReportsEveryProblem: one Configure names all bad attributes.
func TestConfigReportsEveryProblem(t *testing.T) {
	_, diags := decodeConfig(t, "health = \"x\"\nwait_time = \"11m\"\nrate_limit = -1\n", sdk.MeshSettings{})
	var paths []string
	for _, d := range diags {
		paths = append(paths, strings.Join(d.Path, "."))
	}
	slices.Sort(paths)
	if want := []string{"health", "rate_limit", "wait_time"}; !slices.Equal(paths, want) {
		t.Errorf("diagnostic paths = %v, want %v", paths, want)
	}
}

// TestWaitTimeIsADuration: wait_time is a duration attribute, so the host
// rejects a malformed one at its position before the plugin sees it.
func TestWaitTimeIsADuration(t *testing.T) {
	_, diags := configschema.ParseHCL("plugins.hcl", []byte("datacenters = []\nwait_time = \"soon\"\n"), schema)
	if len(diags) != 1 || diags[0].Subject == nil || diags[0].Subject.Start.Line != 2 || !strings.Contains(diags[0].Detail, `"soon" is not a duration`) {
		t.Errorf("diagnostics = %v, want one at line 2 saying \"soon\" is not a duration", diags)
	}
}

// TestTokenNeverInDiagnostics: a token file that is not a valid token
// source is reported without its content.
func TestTokenNeverInDiagnostics(t *testing.T) {
	_, diags := decodeConfig(t, "token = \"hunter2-secret\"\ntoken_file = \"/nonexistent\"\nhealth = \"x\"", sdk.MeshSettings{})
	if strings.Contains(diags.Error(), "hunter2") {
		t.Errorf("diagnostics quote the token: %v", diags)
	}
}

// TestConfigPeers: peers are names, once each, never a listed
// datacenter's (both would be the instance of that cluster); "*" asks the
// agent for every peering.
func TestConfigPeers(t *testing.T) {
	s, diags := decodeConfig(t, `
datacenters = ["dc1"]
peers       = ["*", "east"]
`, sdk.MeshSettings{})
	if diags.HasErrors() || !s.allPeers || !slices.Equal(s.peers, []string{"east"}) {
		t.Errorf("peers %v all %v: %v", s.peers, s.allPeers, diags)
	}
	_, diags = decodeConfig(t, `
datacenters = ["dc1"]
peers       = ["east", "", "east", "dc1"]
`, sdk.MeshSettings{})
	got := diags.Error()
	for _, want := range []string{
		"peers.1: peer name must not be empty",
		`peers.2: peer "east" is listed twice`,
		`peers.3: peer "dc1" has the name of a listed datacenter: both would be instance "dc1"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("diagnostics lack %q:\n%s", want, got)
		}
	}
}

// TestConfigScopes: namespaces and partitions are lists of Consul names,
// "*" for all; the singular attributes are one-name lists, the default
// is "default", and CONSUL_NAMESPACE / CONSUL_PARTITION stand in for an
// unset attribute.
func TestConfigScopes(t *testing.T) {
	t.Setenv("CONSUL_NAMESPACE", "")
	t.Setenv("CONSUL_PARTITION", "")
	for _, tc := range []struct {
		config        string
		ns, parts     []string
		allNS, allPar bool
	}{
		{``, []string{"default"}, []string{"default"}, false, false},
		{`namespace = "team-a"`, []string{"team-a"}, []string{"default"}, false, false},
		{"namespaces = [\"default\", \"team-a\"]\npartitions = [\"p1\"]", []string{"default", "team-a"}, []string{"p1"}, false, false},
		{"namespaces = [\"*\"]\npartitions = [\"*\", \"p2\"]", nil, []string{"p2"}, true, true},
		{`partition = "*"`, []string{"default"}, nil, false, true},
	} {
		s, diags := decodeConfig(t, tc.config, sdk.MeshSettings{})
		if diags.HasErrors() || !slices.Equal(s.namespaces, tc.ns) || !slices.Equal(s.partitions, tc.parts) || s.allNamespaces != tc.allNS || s.allPartitions != tc.allPar {
			t.Errorf("%q: namespaces %v (all %v), partitions %v (all %v), %v", tc.config, s.namespaces, s.allNamespaces, s.partitions, s.allPartitions, diags)
		}
	}
	t.Setenv("CONSUL_NAMESPACE", "from-env")
	if s, _ := decodeConfig(t, ``, sdk.MeshSettings{}); !slices.Equal(s.namespaces, []string{"from-env"}) {
		t.Errorf("CONSUL_NAMESPACE: namespaces %v", s.namespaces)
	}
	if s, _ := decodeConfig(t, `namespaces = ["team-b"]`, sdk.MeshSettings{}); !slices.Equal(s.namespaces, []string{"team-b"}) {
		t.Errorf("namespaces does not replace CONSUL_NAMESPACE: %v", s.namespaces)
	}
}

// TestConfigScopeErrors: bad names and a singular attribute beside its
// plural are reported at the attribute, which the host turns into
// file:line:col with configschema.PathRange.
func TestConfigScopeErrors(t *testing.T) {
	_, diags := decodeConfig(t, `
namespace  = "team-a"
namespaces = ["team-b"]
partitions = ["p1", "", "bad name", "P1", "-p"]
`, sdk.MeshSettings{})
	got := diags.Error()
	for _, want := range []string{
		"namespaces: set namespace or namespaces, not both",
		`partitions.1: partition "" is not a Consul partition name`,
		`partitions.2: partition "bad name" is not a Consul partition name: letters, digits and "-"`,
		`partitions.3: partition "P1" is listed twice`,
		`partitions.4: partition "-p" is not a Consul partition name`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("diagnostics lack %q:\n%s", want, got)
		}
	}
	// Where the host places them: file:line:col of the attribute (a
	// list element's diagnostic points at its list).
	src := "namespace  = \"team-a\"\nnamespaces = [\"team-b\"]\npartitions = [\"p1\", \"\", \"bad name\"]\n"
	f, hd := hclsyntax.ParseConfig([]byte(src), "plugins.hcl", hcl.InitialPos)
	if hd.HasErrors() {
		t.Fatal(hd)
	}
	_, diags = decodeConfig(t, src, sdk.MeshSettings{})
	var at []string
	for _, d := range diags {
		r := configschema.PathRange(f.Body, d.Path)
		at = append(at, fmt.Sprintf("%s:%d:%d %s", r.Filename, r.Start.Line, r.Start.Column, strings.Join(d.Path, ".")))
	}
	slices.Sort(at)
	if want := []string{"plugins.hcl:2:1 namespaces", "plugins.hcl:3:1 partitions.1", "plugins.hcl:3:1 partitions.2"}; !slices.Equal(at, want) {
		t.Errorf("positions %v, want %v", at, want)
	}

	_, diags = decodeConfig(t, "partition = \"p1\"\npartitions = [\"p1\"]\nnamespace = \"a.b\"", sdk.MeshSettings{})
	for _, want := range []string{"partitions: set partition or partitions, not both", `namespace: namespace "a.b" is not a Consul namespace name`} {
		if !strings.Contains(diags.Error(), want) {
			t.Errorf("diagnostics lack %q:\n%s", want, diags.Error())
		}
	}
}
