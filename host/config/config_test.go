package config_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/sdk"
)

var bundled = []string{"consul", "static"}

const zeroSHA = "0000000000000000000000000000000000000000000000000000000000000000"

func parse(t *testing.T, src string) (*config.File, string) {
	t.Helper()
	f, diags := config.Parse("plugins.hcl", []byte(src), bundled)
	return f, config.Format(diags)
}

// TestParseErrors checks that each kind of bad input is reported once, at
// the exact position, with a message that says what is wrong.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want string
	}{{
		name: "syntax error",
		src: `plugin "static" {
  bundled =
}
`,
		want: `plugins.hcl:2:12: error: Invalid expression: Expected the start of an expression, but found an invalid expression token`,
	}, {
		name: "unknown top-level block",
		src: `plugin "static" {}
mesh {}
gateways {
}
`,
		want: `plugins.hcl:3:1: error: Unsupported block type: Blocks of type "gateways" are not expected here`,
	}, {
		name: "unknown attribute in plugin block",
		src: `plugin "static" {
  bundled = "static"
  verbose = true
}
`,
		want: `plugins.hcl:3:3: error: Unsupported argument: An argument named "verbose" is not expected here`,
	}, {
		name: "unknown attribute in xds block",
		src: `xds {
  port = 15010
}
`,
		want: `plugins.hcl:2:3: error: Unsupported argument: An argument named "port" is not expected here`,
	}, {
		name: "args is not a list",
		src: `plugin "static" {
  args = "x"
}
`,
		want: `plugins.hcl:2:11: error: Unsuitable value type: Unsuitable value: list of string required, but have string`,
	}, {
		name: "env is not a map",
		src: `plugin "static" {
  env = ["A=1"]
}
`,
		want: `plugins.hcl:2:9: error: Unsuitable value type: Unsuitable value: map of string required`,
	}, {
		name: "path plugin without sha256",
		src: `mesh {}

plugin "hello" {
  path = "/opt/estuary/hello"
}
`,
		want: "plugins.hcl:3:1: error: Missing required argument: External plugin \"hello\" needs sha256: the hex SHA-256 of its binary (`sha256sum /opt/estuary/hello`)",
	}, {
		name: "sha256 not hex",
		src: `plugin "hello" {
  path   = "/opt/estuary/hello"
  sha256 = "` + strings.Repeat("g", 64) + `"
}
`,
		want: `plugins.hcl:3:12: error: Invalid sha256: sha256 must be 64 hexadecimal digits`,
	}, {
		name: "sha256 too short",
		src: `plugin "hello" {
  path   = "/opt/estuary/hello"
  sha256 = "abc123"
}
`,
		want: `plugins.hcl:3:12: error: Invalid sha256: sha256 must be 64 hexadecimal digits`,
	}, {
		name: "duplicate plugin name",
		src: `plugin "static" {
  config {}
}

  plugin "static" {
  }
`,
		want: "plugins.hcl:5:10: error: Duplicate plugin name: A plugin named \"static\" was already declared at plugins.hcl:1:1. Give each plugin block its own name; use `bundled = \"...\"` to run the same plugin twice",
	}, {
		name: "duplicate xds block",
		src: `xds {}
xds {}
`,
		want: `plugins.hcl:2:1: error: Duplicate xds block: A xds block was already declared at plugins.hcl:1:1`,
	}, {
		name: "xds listen without port",
		src: `xds {
  listen = "127.0.0.1"
}
`,
		want: `plugins.hcl:2:12: error: Invalid listen address: "127.0.0.1": address 127.0.0.1: missing port in address; want HOST:PORT, for example 127.0.0.1:15010`,
	}, {
		name: "admin listen port out of range",
		src: `admin {
    listen = "127.0.0.1:99999"
}
`,
		want: `plugins.hcl:2:14: error: Invalid listen address: "127.0.0.1:99999": port 99999 is out of range; want HOST:PORT, for example 127.0.0.1:15010`,
	}, {
		name: "admin listen host is a name",
		src: `admin { listen = "admin.example.com:15014" }
`,
		want: `plugins.hcl:1:18: error: Invalid listen address: "admin.example.com:15014": "admin.example.com" is not an IP address; want HOST:PORT, for example 127.0.0.1:15010`,
	}, {
		name: "bad duration",
		src: `xds {
  debounce_after = "soon"
}
`,
		want: `plugins.hcl:2:20: error: Invalid duration: "soon" is not a duration such as "100ms" or "30s"`,
	}, {
		name: "bad sync_timeout",
		src: `plugin "static" {
  sync_timeout = "-3s"
}
`,
		want: `plugins.hcl:2:18: error: Invalid duration: "-3s" is not a duration such as "100ms" or "30s"`,
	}, {
		name: "debounce_max shorter than debounce_after",
		src: `xds {
  debounce_after = "2s"
  debounce_max   = "1s"
}
`,
		want: `plugins.hcl:1:1: error: debounce_max is shorter than debounce_after`,
	}, {
		name: "max_connection_age too short and drain_grace negative",
		src: `xds {
  max_connection_age = "100ms"
  drain_grace        = "-1s"
}
`,
		want: "plugins.hcl:2:24: error: max_connection_age is too short: 100ms would have clients reconnect more than they are served; use at least 1s, or \"0\" to keep connections\n" +
			`plugins.hcl:3:24: error: Invalid duration: "-1s" is not a duration such as "100ms" or "30s"`,
	}, {
		name: "unknown bundled plugin by label",
		src: `plugin "kubernetes" {
}
`,
		want: `plugins.hcl:1:8: error: Unknown bundled plugin: No bundled plugin is named "kubernetes" (bundled: consul, static). For an external plugin set path and sha256`,
	}, {
		name: "unknown bundled plugin by attribute",
		src: `plugin "east" {
  bundled = "statik"
}
`,
		want: `plugins.hcl:2:13: error: Unknown bundled plugin: No bundled plugin is named "statik" (bundled: consul, static). For an external plugin set path and sha256`,
	}, {
		name: "both bundled and path",
		src: `plugin "east" {
  bundled = "static"
  path    = "/opt/estuary/static"
  sha256  = "` + zeroSHA + `"
}
`,
		want: `plugins.hcl:3:13: error: Both bundled and path are set: A plugin is either bundled (bundled = "NAME") or an external binary (path = "..." with sha256), not both`,
	}, {
		name: "two config blocks",
		src: `plugin "static" {
  config {}
  config {}
}
`,
		want: `plugins.hcl:3:3: error: Duplicate config block: Plugin "static" already has a config block`,
	}, {
		name: "xds and admin on the same address",
		src: `xds {
  listen = "127.0.0.1:9000"
}
admin {
  listen = "127.0.0.1:9000"
}
`,
		want: `plugins.hcl:5:12: error: Listen address in use twice: xds and admin both listen on 127.0.0.1:9000; xds sets it at plugins.hcl:2:12`,
	}, {
		name: "admin on the xds default",
		src: `admin {
  listen = "127.0.0.1:15010"
}
`,
		want: `plugins.hcl:2:12: error: Listen address in use twice: xds and admin both listen on 127.0.0.1:15010; it is the xds default`,
	}, {
		name: "xds on the admin default",
		src: `xds { listen = "127.0.0.1:15014" }
`,
		want: `plugins.hcl:1:16: error: Listen address in use twice: xds and admin both listen on 127.0.0.1:15014; it is the admin default`,
	}, {
		name: "empty cluster_id",
		src: `mesh {
  cluster_id = ""
}
`,
		want: `plugins.hcl:2:16: error: Empty cluster_id`,
	}, {
		name: "unknown mtls mode",
		src: `mesh {
  mtls = "strict"
}
`,
		want: `plugins.hcl:2:10: error: Unknown mtls mode: mtls = "strict": must be one of STRICT, PERMISSIVE, DISABLE`,
	}, {
		name: "failover rule to itself",
		src: `mesh {
  locality_failover = true
  failover {
    from = "us-east"
    to   = "us-east"
  }
}
`,
		want: `plugins.hcl:3:3: error: Invalid failover rule: failover from "us-east" to itself: a region's own endpoints already come first`,
	}, {
		name: "failover rule with a zone",
		src: `mesh {
  locality_failover = true
  failover {
    from = "us-east/a"
    to   = "us-west"
  }
}
`,
		want: `plugins.hcl:3:3: error: Invalid failover rule: failover { from = "us-east/a" to = "us-west" }: from and to are region names, not empty and without "/"`,
	}, {
		name: "two failover rules for one region",
		src: `mesh {
  locality_failover = false
  failover {
    from = "us-east"
    to   = "us-west"
  }
  failover {
    from = "us-east"
    to   = "eu-west"
  }
}
`,
		want: `plugins.hcl:7:3: error: Duplicate failover rule: region "us-east" already fails over by the rule at plugins.hcl:3:3`,
	}, {
		name: "failover rules without locality_failover",
		src: `mesh {
  failover {
    from = "us-east"
    to   = "us-west"
  }
}
`,
		want: `plugins.hcl:2:3: error: failover without locality_failover: failover rules apply only to locality failover: set locality_failover = true (every service) or false (services that opt in)`,
	}, {
		name: "trust domain with a path",
		src: `mesh { trust_domain = "spiffe://cluster.local" }
`,
		want: `plugins.hcl:1:23: error: Invalid trust_domain: trust_domain = "spiffe://cluster.local": must be a non-empty name without "/" or ":", as in spiffe://TRUST_DOMAIN/ns/NS/sa/SA`,
	}, {
		name: "default_service_export_to: a bad entry, pointed at",
		src: `mesh {
  default_service_export_to = [".", "Team_A"]
}
`,
		want: `plugins.hcl:2:37: error: Invalid default_service_export_to: default_service_export_to[1]: "Team_A" is not ".", "*", "~" or a namespace name: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`,
	}, {
		name: "default_service_export_to: * with others, a repeat",
		src: `mesh { default_service_export_to = ["*", "a", "a"] }
`,
		want: `plugins.hcl:1:37: error: Invalid default_service_export_to: default_service_export_to[0]: "*" cannot be combined with other values
plugins.hcl:1:47: error: Invalid default_service_export_to: default_service_export_to[2]: "a" is listed twice`,
	}, {
		name: "default_service_export_to: empty",
		src: `mesh { default_service_export_to = [] }
`,
		want: `plugins.hcl:1:36: error: Empty default_service_export_to: default_service_export_to = []: name at least one entry; "~" exports services to no namespace`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, got := parse(t, tt.src)
			if got != tt.want+"\n" {
				t.Errorf("diagnostics:\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

// TestDefaultServiceExportTo: "*" unless set; set, read as written.
func TestDefaultServiceExportTo(t *testing.T) {
	f, diags := parse(t, "mesh {}\n")
	if diags != "" || !slices.Equal(f.DefaultServiceExportTo, []string{"*"}) {
		t.Fatalf("default: %v %s", f.DefaultServiceExportTo, diags)
	}
	f, diags = parse(t, "mesh {\n  default_service_export_to = [\".\", \"istio-system\"]\n}\n")
	if diags != "" || !slices.Equal(f.DefaultServiceExportTo, []string{".", "istio-system"}) {
		t.Fatalf("set: %v %s", f.DefaultServiceExportTo, diags)
	}
}

// TestMeshMTLS: each mode and a trust domain are read as written.
func TestMeshMTLS(t *testing.T) {
	for _, mode := range config.MTLSModes {
		f, diags := parse(t, "mesh {\n  mtls = \""+mode+"\"\n  trust_domain = \"example.org\"\n}\n")
		if diags != "" {
			t.Fatalf("mtls = %q: %s", mode, diags)
		}
		if f.Mesh.MTLS != mode || f.Mesh.TrustDomain != "example.org" {
			t.Errorf("mesh = %+v, want mtls %s and trust domain example.org", f.Mesh, mode)
		}
	}
}

// TestParseReportsEveryError checks that independent mistakes in different
// blocks are all reported in one pass, in file order.
func TestParseReportsEveryError(t *testing.T) {
	_, got := parse(t, `xds {
  listen = "localhost"
}

plugin "static" {
  colour = "blue"
}

plugin "ext" {
  path = "/opt/ext"
}
`)
	want := strings.Join([]string{
		`plugins.hcl:2:12: error: Invalid listen address: "localhost": address localhost: missing port in address; want HOST:PORT, for example 127.0.0.1:15010`,
		`plugins.hcl:6:3: error: Unsupported argument: An argument named "colour" is not expected here`,
		"plugins.hcl:9:1: error: Missing required argument: External plugin \"ext\" needs sha256: the hex SHA-256 of its binary (`sha256sum /opt/ext`)",
	}, "\n") + "\n"
	if got != want {
		t.Errorf("diagnostics:\n got:\n%s\nwant:\n%s", got, want)
	}
}

func TestParseDefaults(t *testing.T) {
	f, diags := parse(t, `plugin "static" {}`)
	if diags != "" {
		t.Fatalf("unexpected diagnostics:\n%s", diags)
	}
	want := config.File{
		Mesh: config.Mesh{DomainSuffix: "cluster.local", ClusterID: "Kubernetes", Network: "", MTLS: "PERMISSIVE", TrustDomain: "cluster.local"},
		XDS: config.XDS{Listen: "127.0.0.1:15010", DebounceAfter: 100 * time.Millisecond, DebounceMax: 10 * time.Second,
			MaxConnectionAge: 30 * time.Minute, DrainGrace: 5 * time.Second,
			MaxViews: 1000, MaxConnections: 10000, MaxStreamsPerConnection: 100, MaxResourceNames: 50000, MaxUnknownTypes: 4},
		Admin: config.Admin{Listen: "127.0.0.1:15014", MaxConnections: config.DefaultAdminMaxConnections},
	}
	if f.Mesh != want.Mesh {
		t.Errorf("mesh = %+v, want %+v", f.Mesh, want.Mesh)
	}
	if f.XDS != want.XDS {
		t.Errorf("xds = %+v, want %+v", f.XDS, want.XDS)
	}
	if f.Admin != want.Admin {
		t.Errorf("admin = %+v, want %+v", f.Admin, want.Admin)
	}
	if f.Networks != nil {
		t.Errorf("networks body set without a networks block")
	}
	if len(f.Plugins) != 1 {
		t.Fatalf("plugins = %d, want 1", len(f.Plugins))
	}
	p := f.Plugins[0]
	if p.Label != "static" || p.Bundled != "static" || p.External() || p.SyncTimeout != 30*time.Second {
		t.Errorf("plugin = %+v, want label and bundled static, sync timeout 30s", p)
	}
}

// TestListenOnPortZeroTwice: xds and admin may both ask for a free port.
func TestListenOnPortZeroTwice(t *testing.T) {
	if _, diags := parse(t, "xds { listen = \"127.0.0.1:0\" }\nadmin { listen = \"127.0.0.1:0\" }\n"); diags != "" {
		t.Error(diags)
	}
}

func TestParseSettings(t *testing.T) {
	f, diags := parse(t, `
mesh {
  domain_suffix = "mesh.example"
  cluster_id    = "east"
  network       = "net-east"
}
xds {
  listen         = "0.0.0.0:18000"
  insecure       = true
  debounce_after = "250ms"
  debounce_max   = "2s"
  max_connection_age = "0"
  drain_grace    = "20s"
}
admin { listen = "[::1]:18001" }
networks {
  anything = "goes"
}
plugin "static" {}

plugin "east" {
  bundled      = "static"
  sync_timeout = "5s"
  config {
    cluster = "east"
  }
}

plugin "hello" {
  path   = "/opt/estuary/hello"
  sha256 = "`+strings.Repeat("AB", 32)+`"
  args   = ["-v", "--x"]
  env    = { GREETING = "hi" }
}
`)
	if diags != "" {
		t.Fatalf("unexpected diagnostics:\n%s", diags)
	}
	if want := (config.Mesh{DomainSuffix: "mesh.example", ClusterID: "east", Network: "net-east", MTLS: "PERMISSIVE", TrustDomain: "cluster.local"}); f.Mesh != want {
		t.Errorf("mesh = %+v, want %+v", f.Mesh, want)
	}
	if want := (config.XDS{Listen: "0.0.0.0:18000", DebounceAfter: 250 * time.Millisecond, DebounceMax: 2 * time.Second, DrainGrace: 20 * time.Second,
		Insecure: true, MaxViews: 1000, MaxConnections: 10000, MaxStreamsPerConnection: 100, MaxResourceNames: 50000, MaxUnknownTypes: 4}); f.XDS != want {
		t.Errorf("xds = %+v, want %+v", f.XDS, want)
	}
	if f.Admin.Listen != "[::1]:18001" {
		t.Errorf("admin listen = %q", f.Admin.Listen)
	}
	if f.Networks == nil {
		t.Errorf("networks body not kept")
	}
	if want := (sdk.MeshSettings{DomainSuffix: "mesh.example", ClusterID: "east", Network: "net-east"}); !f.Mesh.Settings().Equal(want) {
		t.Errorf("settings = %+v, want %+v", f.Mesh.Settings(), want)
	}

	type plugin struct {
		label, bundled, path, sha string
		external                  bool
		sync                      time.Duration
	}
	var got []plugin
	for _, p := range f.Plugins {
		got = append(got, plugin{p.Label, p.Bundled, p.Path, p.SHA256, p.External(), p.SyncTimeout})
	}
	want := []plugin{
		{label: "static", bundled: "static", sync: 30 * time.Second},
		{label: "east", bundled: "static", sync: 5 * time.Second},
		{label: "hello", path: "/opt/estuary/hello", sha: strings.Repeat("AB", 32), external: true, sync: 30 * time.Second},
	}
	if !slices.Equal(got, want) {
		t.Errorf("plugins:\n got %+v\nwant %+v", got, want)
	}
	hello := f.Plugins[2]
	if !slices.Equal(hello.Args, []string{"-v", "--x"}) || len(hello.Env) != 1 || hello.Env["GREETING"] != "hi" {
		t.Errorf("hello args %q env %v", hello.Args, hello.Env)
	}
	if hello.PathRange.Start.Line != 30 || hello.SHA256Range.Start.Line != 31 {
		t.Errorf("path at line %d, sha256 at line %d; want 30 and 31", hello.PathRange.Start.Line, hello.SHA256Range.Start.Line)
	}
	// The east block has a config body the plugin's schema decodes later.
	attrs, _ := f.Plugins[1].Config.JustAttributes()
	if _, ok := attrs["cluster"]; !ok {
		t.Errorf("east config body lacks its cluster attribute")
	}
}

func TestPluginSame(t *testing.T) {
	f, diags := parse(t, `
plugin "a" {
  bundled = "static"
  args = ["x"]
  config { cluster = "a" }
}
plugin "b" {
  bundled = "static"
  args = ["x"]
  config { cluster = "b" }
}
plugin "c" {
  bundled = "static"
  args = ["x", "y"]
}
plugin "d" {
  bundled = "static"
  args = ["x"]
  env = { A = "1" }
}
`)
	if diags != "" {
		t.Fatal(diags)
	}
	a, b, c, d := f.Plugins[0], f.Plugins[1], f.Plugins[2], f.Plugins[3]
	if !a.Same(b) {
		t.Errorf("a and b differ only in config, want Same")
	}
	if a.Same(c) || a.Same(d) {
		t.Errorf("different args or env reported Same")
	}
}

func writeBinary(t *testing.T, content string) (path, sum string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "estuary-plugin-hello")
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256([]byte(content))
	return path, hex.EncodeToString(h[:])
}

func TestVerifyBinary(t *testing.T) {
	bin, sum := writeBinary(t, "#!/bin/sh\necho hello\n")
	missing := filepath.Join(filepath.Dir(bin), "nope")
	tests := []struct {
		name, path, sha string
		want            string
	}{
		{name: "matching", path: bin, sha: sum},
		{name: "matching, upper case", path: bin, sha: strings.ToUpper(sum)},
		{
			name: "missing binary", path: missing, sha: sum,
			want: fmt.Sprintf(`plugins.hcl:3:12: error: Plugin binary not found: Plugin "hello": open %s: no such file or directory`, missing),
		},
		{
			name: "sha256 mismatch", path: bin, sha: zeroSHA,
			want: fmt.Sprintf(`plugins.hcl:4:12: error: Plugin binary checksum mismatch: Plugin "hello": %s has sha256 %s, but plugins.hcl expects %s. The binary was not started`, bin, sum, zeroSHA),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := fmt.Sprintf("plugin \"hello\" {\n\n  path   = %q\n  sha256 = %q\n}\n", tt.path, tt.sha)
			f, diags := parse(t, src)
			if diags != "" {
				t.Fatal(diags)
			}
			got := config.Format(config.VerifyBinary(f.Plugins[0]))
			if tt.want == "" && got != "" {
				t.Errorf("unexpected diagnostics:\n%s", got)
			}
			if tt.want != "" && got != tt.want+"\n" {
				t.Errorf("diagnostics:\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

func TestVerifyBinarySkipsBundled(t *testing.T) {
	f, diags := parse(t, `plugin "static" {}`)
	if diags != "" {
		t.Fatal(diags)
	}
	if d := config.VerifyBinary(f.Plugins[0]); len(d) != 0 {
		t.Errorf("bundled plugin: %s", config.Format(d))
	}
}

// TestPluginDiagnostics checks that a diagnostic a plugin returns with a
// path into its config lands on the line and column of that attribute.
func TestPluginDiagnostics(t *testing.T) {
	const src = `plugin "east" {
  bundled = "static"
  config {
    cluster = "east"
    service "a.example.com" {
      port "http" {
        number = 80
      }
    }
    service "b.example.com" {
      port "http" {
        number = 80
      }
      port "grpc" {
          number = 0
      }
      endpoint {
        address = "10.0.0.1"
      }
    }
  }
}
`
	f, diags := parse(t, src)
	if diags != "" {
		t.Fatal(diags)
	}
	p := f.Plugins[0]
	tests := []struct {
		path []string
		sev  sdk.Severity
		want string
	}{
		{[]string{"service", "1", "port", "1", "number"}, sdk.SeverityError, `plugins.hcl:15:11: error: plugin "east": bad port`},
		{[]string{"service", "0", "port", "0", "number"}, sdk.SeverityError, `plugins.hcl:7:9: error: plugin "east": bad port`},
		{[]string{"cluster"}, sdk.SeverityWarning, `plugins.hcl:4:5: warning: plugin "east": bad port`},
		// An attribute that is not set points at its block.
		{[]string{"service", "1", "endpoint", "0", "weight"}, sdk.SeverityError, `plugins.hcl:17:7: error: plugin "east": bad port`},
		// A block index past the end points at the deepest block found.
		{[]string{"service", "1", "port", "7", "number"}, sdk.SeverityError, `plugins.hcl:10:5: error: plugin "east": bad port`},
		// No path: the config block itself.
		{nil, sdk.SeverityError, `plugins.hcl:3:10: error: plugin "east": bad port`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.path, "."), func(t *testing.T) {
			got := config.Format(p.PluginDiagnostics(sdk.Diagnostics{{Severity: tt.sev, Summary: "bad port", Path: tt.path}}))
			if got != tt.want+"\n" {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestUnsafePluginBinaries: a binary that someone other than root or the
// host's user could replace is refused at its path attribute, as is a
// relative path, which $PATH or the working directory would resolve.
func TestUnsafePluginBinaries(t *testing.T) {
	content := "#!/bin/sh\necho hello\n"
	tests := []struct {
		name  string
		setup func(path string) error
		want  string
	}{
		{"group writable", func(p string) error { return os.Chmod(p, 0o775) }, "is writable by its group or by others (mode 0775)"},
		{"world writable", func(p string) error { return os.Chmod(p, 0o757) }, "is writable by its group or by others (mode 0757)"},
		{"owned by another user", func(p string) error {
			if os.Getuid() != 0 {
				t.Skip("changing a file's owner takes root")
			}
			return os.Chown(p, 4242, 4242)
		}, "is owned by uid 4242; it must be owned by root or by the user estuary runs as"},
		{"a directory", func(p string) error {
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Mkdir(p, 0o755)
		}, "is not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin, sum := writeBinary(t, content)
			if err := tt.setup(bin); err != nil {
				t.Fatal(err)
			}
			src := fmt.Sprintf("plugin \"hello\" {\n  path   = %q\n  sha256 = %q\n}\n", bin, sum)
			f, diags := parse(t, src)
			if diags != "" {
				t.Fatal(diags)
			}
			got := config.Format(config.VerifyBinary(f.Plugins[0]))
			want := fmt.Sprintf("plugins.hcl:2:12: error: Unsafe plugin binary: Plugin \"hello\": %s %s", bin, tt.want)
			if !strings.HasPrefix(got, want) {
				t.Errorf("diagnostics:\n got: %s\nwant: %s...", got, want)
			}
		})
	}
	t.Run("relative path", func(t *testing.T) {
		_, diags := parse(t, fmt.Sprintf("plugin \"hello\" {\n  path   = \"bin/hello\"\n  sha256 = %q\n}\n", zeroSHA))
		want := `plugins.hcl:2:12: error: Plugin path is not absolute: Plugin "hello": path "bin/hello" must be absolute, for example "/opt/estuary/plugins/hello"`
		if diags != want+"\n" {
			t.Errorf("diagnostics:\n got: %s\nwant: %s", diags, want)
		}
	})
}

// TestLocalityFailover: the mesh block's locality failover is kept apart
// from the mesh settings plugins get, rules in file order; without the
// attribute it is nil, which keeps views without localities.
func TestLocalityFailover(t *testing.T) {
	f, diags := parse(t, `mesh {
  locality_failover = true
  failover {
    from = "us-east"
    to   = "us-west"
  }
  failover {
    from = "us-west"
    to   = "us-east"
  }
}
`)
	if diags != "" {
		t.Fatal(diags)
	}
	if f.Locality.Failover == nil || !*f.Locality.Failover || len(f.Locality.Rules) != 2 ||
		f.Locality.Rules[0] != (config.FailoverRule{From: "us-east", To: "us-west"}) || f.Locality.Rules[1].From != "us-west" {
		t.Errorf("locality = %+v", f.Locality)
	}
	f, _ = parse(t, `mesh { cluster_id = "c" }`)
	if f.Locality.Failover != nil || f.Locality.Rules != nil {
		t.Errorf("without the attribute: %+v", f.Locality)
	}
}
