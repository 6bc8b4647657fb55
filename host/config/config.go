// Package config reads plugins.hcl, the host's configuration file.
//
//	mesh    { domain_suffix = "cluster.local"  cluster_id = "Kubernetes"  network = ""
//	          mtls = "PERMISSIVE"  trust_domain = "cluster.local"  default_service_export_to = ["*"] }
//	xds     { listen = "127.0.0.1:15010"  debounce_after = "100ms"  debounce_max = "10s"
//	          max_connection_age = "30m"  drain_grace = "5s"
//	          insecure = false  max_views = 1000  max_connections = 10000
//	          max_streams_per_connection = 100  max_resource_names = 50000  max_unknown_types = 4
//	          tls { cert_file = "..."  key_file = "..."  client_ca_file = "..." }
//	          authorize { routers = ["spiffe://..."]  trust_domain "TD" { clusters = []  networks = [] } } }
//	admin   { listen = "127.0.0.1:15014"  token_file = "..."  insecure = false  max_connections = 64
//	          tls { cert_file = "..."  key_file = "..."  client_ca_file = "..." } }
//	plugin "LABEL" {
//	  bundled = "consul"          # or: path = "/opt/p"  sha256 = "..."
//	  args    = []  env = {}  sync_timeout = "30s"
//	  config { ... }              # decoded against the plugin's own schema
//	}
//	networks { ... }              # see host/network
//
// Every problem is reported at once, each with file, line and column.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/estuary-mesh/estuary/host/visibility"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
)

// Defaults.
const (
	DefaultXDSListen     = "127.0.0.1:15010"
	DefaultAdminListen   = "127.0.0.1:15014"
	DefaultDomainSuffix  = "cluster.local"
	DefaultMTLS          = "PERMISSIVE"
	DefaultTrustDomain   = "cluster.local"
	DefaultClusterID     = "Kubernetes"
	DefaultDebounceAfter = 100 * time.Millisecond
	DefaultDebounceMax   = 10 * time.Second
	DefaultSyncTimeout   = 30 * time.Second
	// DefaultMaxConnectionAge is istiod's default
	// (--keepaliveMaxServerConnectionAge).
	DefaultMaxConnectionAge = 30 * time.Minute
	DefaultDrainGrace       = 5 * time.Second
	// MinMaxConnectionAge is the shortest max_connection_age accepted:
	// shorter would have clients reconnecting more than they are served.
	MinMaxConnectionAge = time.Second

	// Per-client state limits of the xDS server (see xds.Limits). A mesh
	// has few views (kinds × networks × clusters); a proxy uses one
	// stream; an Envoy with every service of a large mesh asks for tens
	// of thousands of names at most.
	DefaultMaxViews                = 1000
	DefaultMaxConnections          = 10000
	DefaultMaxStreamsPerConnection = 100
	DefaultMaxResourceNames        = 50000
	DefaultMaxUnknownTypes         = 4
)

// File is a decoded plugins.hcl.
type File struct {
	// Filename as given to Load.
	Filename string
	Mesh     Mesh
	// DefaultServiceExportTo is mesh.default_service_export_to: the
	// exportTo of services that set none, as Istio's
	// meshConfig.defaultServiceExportTo; "*" unless set. (Outside Mesh,
	// which plugins' generations compare with ==.)
	DefaultServiceExportTo []string
	Locality               Locality // from the mesh block
	XDS                    XDS
	Admin                  Admin
	Plugins                []*Plugin
	// Networks is the body of the networks block, nil when absent. The
	// network manager decodes it.
	Networks hcl.Body
	// Source is the file's content, for /debug/configz.
	Source []byte
}

// Mesh holds mesh-wide settings that plugins default to.
type Mesh struct {
	DomainSuffix string `json:"domain_suffix"`
	ClusterID    string `json:"cluster_id"`
	Network      string `json:"network"`
	// MTLS is the workload mTLS mode of the clusters Estuary serves:
	// STRICT, PERMISSIVE (Istio's auto mTLS, the default) or DISABLE.
	MTLS string `json:"mtls"`
	// TrustDomain completes bare service account names into SPIFFE IDs.
	TrustDomain string `json:"trust_domain"`
}

// Locality is the locality failover of the mesh block. It is kept out
// of Mesh, which plugins are configured with: it concerns only what the
// xDS server sends, so changing it restarts no plugin.
type Locality struct {
	// Failover is nil when the mesh block does not set locality_failover:
	// views then ignore the clients' localities entirely, as before the
	// setting existed. True orders every service's endpoints by
	// locality; false does so only for services that opt in.
	Failover *bool `json:"locality_failover,omitempty"`
	// Rules, in file order: a client in region From whose own region has
	// no endpoint left goes to region To next (Istio's
	// LocalityLoadBalancerSetting.failover).
	Rules []FailoverRule `json:"failover,omitempty"`
}

// FailoverRule maps a client's region to the region to use next.
type FailoverRule struct {
	From string `json:"from" hcl:"from"`
	To   string `json:"to" hcl:"to"`
}

// MTLSModes are the values of mesh mtls: Istio's PeerAuthentication modes.
var MTLSModes = []string{"STRICT", "PERMISSIVE", "DISABLE"}

// Settings converts the mesh block for plugins.
func (m Mesh) Settings() sdk.MeshSettings {
	return sdk.MeshSettings{DomainSuffix: m.DomainSuffix, ClusterID: m.ClusterID, Network: m.Network}
}

// XDS configures the xDS server.
type XDS struct {
	Listen        string        `json:"listen"`
	DebounceAfter time.Duration `json:"debounce_after"`
	DebounceMax   time.Duration `json:"debounce_max"`
	// MaxConnectionAge sends each client connection a GOAWAY after about
	// this long (grpc-go adds ±10% per connection), so clients spread
	// over the replicas after a rollout; 0 keeps connections forever.
	MaxConnectionAge time.Duration `json:"max_connection_age"`
	// DrainGrace is how long streams are still served after a GOAWAY,
	// from max_connection_age or on SIGTERM, before they are closed.
	DrainGrace time.Duration `json:"drain_grace"`
	// Insecure allows a listen address beyond loopback without tls.
	Insecure bool `json:"insecure"`
	// TLS, if set, serves xDS over TLS; nil serves plain text.
	TLS *XDSTLS `json:"tls,omitempty"`
	// Authorize is what client identities allow their nodes to claim;
	// nil applies only the namespace rule (with client certificates).
	Authorize *XDSAuthorize `json:"authorize,omitempty"`
	// Limits on per-client state, each with its default.
	MaxViews                int `json:"max_views"`
	MaxConnections          int `json:"max_connections"`
	MaxStreamsPerConnection int `json:"max_streams_per_connection"`
	MaxResourceNames        int `json:"max_resource_names"`
	MaxUnknownTypes         int `json:"max_unknown_types"`
}

// XDSTLS is the xds tls block: the server's certificate and key and,
// optionally, the CA client certificates must chain to (then required).
type XDSTLS struct {
	CertFile     string `json:"cert_file"`
	KeyFile      string `json:"key_file"`
	ClientCAFile string `json:"client_ca_file,omitempty"`
	// Where each attribute is written, for CheckXDSTLSFiles.
	CertRange, KeyRange, ClientCARange hcl.Range `json:"-"`
}

// XDSAuthorize is the xds authorize block.
type XDSAuthorize struct {
	// Routers are the SPIFFE IDs allowed to connect as router~ nodes.
	Routers []string `json:"routers"`
	// TrustDomains, if not nil, are the only trust domains allowed, each
	// with the CLUSTER_IDs and NETWORKs its nodes may claim.
	TrustDomains map[string]TrustDomainClaims `json:"trust_domains,omitempty"`
}

// TrustDomainClaims is one trust_domain block; an empty list allows any.
type TrustDomainClaims struct {
	Clusters []string `json:"clusters,omitempty"`
	Networks []string `json:"networks,omitempty"`
}

// Admin configures the admin HTTP server (see admin.go).
type Admin struct {
	Listen string `json:"listen"`
	// TokenFile holds the bearer token requests must present.
	TokenFile string `json:"token_file,omitempty"`
	// TLS serves HTTPS; with a client CA, a verified client certificate
	// also authenticates a request.
	TLS *AdminTLS `json:"tls,omitempty"`
	// Insecure allows a listen address beyond loopback without a token or
	// client certificates.
	Insecure bool `json:"insecure,omitempty"`
	// MaxConnections bounds the connections served at once.
	MaxConnections int `json:"max_connections"`
}

// Plugin is one plugin block.
type Plugin struct {
	// Label names the plugin in logs and debug views, and keys its instances.
	Label string `json:"label"`
	// Bundled names the bundled plugin that runs; empty for external ones.
	Bundled string `json:"bundled,omitempty"`
	// Path and SHA256 locate an external plugin binary.
	Path   string            `json:"path,omitempty"`
	SHA256 string            `json:"sha256,omitempty"`
	Args   []string          `json:"args,omitempty"`
	Env    map[string]string `json:"env,omitempty"`
	// SyncTimeout bounds how long the host waits for the plugin to declare
	// its instance set complete, on every (re)start: readiness waits that
	// long, and instances a restarted plugin has not declared again keep
	// serving, stale, until then.
	SyncTimeout time.Duration `json:"sync_timeout"`
	// Config is the body of the config block (an empty body when absent).
	Config hcl.Body `json:"-"`
	// ConfigJSON is Config decoded against the plugin's schema, set by
	// DecodeConfig once the supervisor has the plugin's schema. It holds
	// sensitive values: show ConfigView instead.
	ConfigJSON []byte `json:"-"`
	// Schema is the plugin's schema ConfigJSON was decoded against.
	Schema *sdk.Schema `json:"-"`
	// DecodeCache, if set, is what DecodeConfig keeps between loads of
	// the file, so that a reload decodes only the blocks that changed
	// (the host sets one per plugin label).
	DecodeCache *configschema.Cache `json:"-"`
	// source is the whole file Config was parsed from.
	source []byte
	// DeclRange is where the block starts.
	DeclRange hcl.Range `json:"-"`
	// PathRange and SHA256Range point at those attributes.
	PathRange, SHA256Range hcl.Range `json:"-"`
}

// External reports whether the plugin is a binary of its own.
func (p *Plugin) External() bool { return p.Path != "" }

// Same reports whether two plugin blocks run the same thing the same way,
// so a reload needs no restart (the config block may still differ).
func (p *Plugin) Same(o *Plugin) bool {
	return p.Bundled == o.Bundled && p.Path == o.Path && p.SHA256 == o.SHA256 &&
		strings.Join(p.Args, "\x00") == strings.Join(o.Args, "\x00") && fmt.Sprint(p.Env) == fmt.Sprint(o.Env)
}

var rootSchema = &hcl.BodySchema{
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "mesh"}, {Type: "xds"}, {Type: "admin"}, {Type: "networks"},
		{Type: "plugin", LabelNames: []string{"name"}},
	},
}

type meshBlock struct {
	DomainSuffix *string `hcl:"domain_suffix,optional"`
	ClusterID    *string `hcl:"cluster_id,optional"`
	Network      *string `hcl:"network,optional"`
	MTLS         *string `hcl:"mtls,optional"`
	TrustDomain  *string `hcl:"trust_domain,optional"`
	// ExportTo is kept as an expression, so an entry's error points at it.
	ExportTo hcl.Expression `hcl:"default_service_export_to,optional"`
	Locality *bool          `hcl:"locality_failover,optional"`
	Failover []FailoverRule `hcl:"failover,block"`
}

type xdsBlock struct {
	Listen        *string `hcl:"listen,optional"`
	DebounceAfter *string `hcl:"debounce_after,optional"`
	DebounceMax   *string `hcl:"debounce_max,optional"`
	MaxConnAge    *string `hcl:"max_connection_age,optional"`
	DrainGrace    *string `hcl:"drain_grace,optional"`
	Insecure      *bool   `hcl:"insecure,optional"`
	MaxViews      *int    `hcl:"max_views,optional"`
	MaxConns      *int    `hcl:"max_connections,optional"`
	MaxStreams    *int    `hcl:"max_streams_per_connection,optional"`
	MaxNames      *int    `hcl:"max_resource_names,optional"`
	MaxUnknown    *int    `hcl:"max_unknown_types,optional"`

	TLS       *xdsTLSBlock       `hcl:"tls,block"`
	Authorize *xdsAuthorizeBlock `hcl:"authorize,block"`
}

type xdsTLSBlock struct {
	CertFile     string    `hcl:"cert_file"`
	KeyFile      string    `hcl:"key_file"`
	ClientCAFile *string   `hcl:"client_ca_file,optional"`
	Body         hcl.Body  `hcl:",body"`
	DefRange     hcl.Range `hcl:",def_range"`
}

type xdsAuthorizeBlock struct {
	Routers      []string           `hcl:"routers,optional"`
	TrustDomains []trustDomainBlock `hcl:"trust_domain,block"`
	Body         hcl.Body           `hcl:",body"`
	DefRange     hcl.Range          `hcl:",def_range"`
}

type trustDomainBlock struct {
	Name     string    `hcl:"name,label"`
	Clusters []string  `hcl:"clusters,optional"`
	Networks []string  `hcl:"networks,optional"`
	DefRange hcl.Range `hcl:",def_range"`
}

type adminBlock struct {
	Listen         *string        `hcl:"listen,optional"`
	TokenFile      *string        `hcl:"token_file,optional"`
	Insecure       *bool          `hcl:"insecure,optional"`
	MaxConnections *int           `hcl:"max_connections,optional"`
	TLS            *adminTLSBlock `hcl:"tls,block"`
	Body           hcl.Body       `hcl:",body"`
}

var pluginSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "bundled"}, {Name: "path"}, {Name: "sha256"}, {Name: "args"}, {Name: "env"}, {Name: "sync_timeout"},
	},
	Blocks: []hcl.BlockHeaderSchema{{Type: "config"}},
}

// Load reads and validates a plugins.hcl file. Bundled plugin names are
// checked against bundled; plugin config blocks are not decoded here (see
// Plugin.DecodeConfig), since their schemas come from the plugins.
func Load(filename string, bundled []string) (*File, hcl.Diagnostics) {
	src, err := os.ReadFile(filename)
	if err != nil {
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Cannot read configuration", Detail: err.Error()}}
	}
	return Parse(filename, src, bundled)
}

// Parse is Load for content already read.
func Parse(filename string, src []byte, bundled []string) (*File, hcl.Diagnostics) {
	parser := hclparse.NewParser()
	f, diags := parser.ParseHCL(src, filename)
	if diags.HasErrors() {
		return nil, diags
	}
	out := &File{
		Filename:               filename,
		Source:                 src,
		Mesh:                   Mesh{DomainSuffix: DefaultDomainSuffix, ClusterID: DefaultClusterID, MTLS: DefaultMTLS, TrustDomain: DefaultTrustDomain},
		DefaultServiceExportTo: visibility.DefaultExportTo,
		XDS: XDS{Listen: DefaultXDSListen, DebounceAfter: DefaultDebounceAfter, DebounceMax: DefaultDebounceMax,
			MaxConnectionAge: DefaultMaxConnectionAge, DrainGrace: DefaultDrainGrace,
			MaxViews: DefaultMaxViews, MaxConnections: DefaultMaxConnections, MaxStreamsPerConnection: DefaultMaxStreamsPerConnection,
			MaxResourceNames: DefaultMaxResourceNames, MaxUnknownTypes: DefaultMaxUnknownTypes},
		Admin: Admin{Listen: DefaultAdminListen, MaxConnections: DefaultAdminMaxConnections},
	}
	content, d := f.Body.Content(rootSchema)
	diags = append(diags, d...)
	seen := map[string]*hcl.Block{}
	labels := map[string]*hcl.Block{}
	for _, b := range content.Blocks {
		if b.Type != "plugin" {
			if prev, dup := seen[b.Type]; dup {
				diags = append(diags, &hcl.Diagnostic{
					Severity: hcl.DiagError, Summary: fmt.Sprintf("Duplicate %s block", b.Type),
					Detail:  fmt.Sprintf("A %s block was already declared at %s.", b.Type, position(prev.DefRange)),
					Subject: b.DefRange.Ptr(),
				})
				continue
			}
			seen[b.Type] = b
		}
		switch b.Type {
		case "mesh":
			diags = append(diags, decodeMesh(b, &out.Mesh, &out.DefaultServiceExportTo, &out.Locality)...)
		case "xds":
			diags = append(diags, decodeXDS(b, &out.XDS)...)
		case "admin":
			diags = append(diags, decodeAdmin(b, &out.Admin)...)
		case "networks":
			out.Networks = b.Body
		case "plugin":
			label := b.Labels[0]
			if prev, dup := labels[label]; dup {
				diags = append(diags, &hcl.Diagnostic{
					Severity: hcl.DiagError, Summary: "Duplicate plugin name",
					Detail:  fmt.Sprintf("A plugin named %q was already declared at %s. Give each plugin block its own name; use `bundled = \"...\"` to run the same plugin twice.", label, position(prev.DefRange)),
					Subject: b.LabelRanges[0].Ptr(),
				})
				continue
			}
			labels[label] = b
			p, d := decodePlugin(b, bundled)
			diags = append(diags, d...)
			if p != nil {
				p.source = src
				out.Plugins = append(out.Plugins, p)
			}
		}
	}
	// Port 0 asks the kernel for a free port: two such addresses never
	// clash, which is how tests run the host.
	if _, port, _ := net.SplitHostPort(out.XDS.Listen); out.XDS.Listen == out.Admin.Listen && port != "0" {
		diags = append(diags, listenClash(out.XDS.Listen, seen["xds"], seen["admin"]))
	}
	return out, diags
}

// listenClash reports xds and admin sharing an address, at the admin
// listen attribute when it is set (else at the xds one), naming the other.
func listenClash(addr string, xds, admin *hcl.Block) *hcl.Diagnostic {
	d := &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Listen address in use twice",
		Detail: fmt.Sprintf("xds and admin both listen on %s.", addr)}
	xr, xok := listenRange(xds)
	ar, aok := listenRange(admin)
	switch {
	case aok && xok:
		d.Subject = ar.Ptr()
		d.Detail = fmt.Sprintf("xds and admin both listen on %s; xds sets it at %s.", addr, position(xr))
	case aok:
		d.Subject = ar.Ptr()
		d.Detail = fmt.Sprintf("xds and admin both listen on %s; it is the xds default.", addr)
	case xok:
		d.Subject = xr.Ptr()
		d.Detail = fmt.Sprintf("xds and admin both listen on %s; it is the admin default.", addr)
	}
	return d
}

// listenRange returns the range of a block's listen attribute, if set.
func listenRange(b *hcl.Block) (hcl.Range, bool) {
	if b == nil {
		return hcl.Range{}, false
	}
	attrs, _ := b.Body.JustAttributes()
	if a, ok := attrs["listen"]; ok {
		return a.Expr.Range(), true
	}
	return hcl.Range{}, false
}

// position renders where a range starts as FILE:LINE:COL, the form every
// diagnostic uses.
func position(r hcl.Range) string {
	return fmt.Sprintf("%s:%d:%d", r.Filename, r.Start.Line, r.Start.Column)
}

func decodeMesh(b *hcl.Block, m *Mesh, exportTo *[]string, loc *Locality) hcl.Diagnostics {
	var mb meshBlock
	diags := gohcl.DecodeBody(b.Body, nil, &mb)
	if mb.DomainSuffix != nil {
		m.DomainSuffix = *mb.DomainSuffix
	}
	if mb.ClusterID != nil {
		m.ClusterID = *mb.ClusterID
		if m.ClusterID == "" {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Empty cluster_id", Subject: attrRange(b.Body, "cluster_id").Ptr()})
		}
	}
	if mb.Network != nil {
		m.Network = *mb.Network
	}
	if mb.MTLS != nil {
		m.MTLS = *mb.MTLS
		if !slices.Contains(MTLSModes, m.MTLS) {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Unknown mtls mode",
				Detail:  fmt.Sprintf("mtls = %q: must be one of %s.", m.MTLS, strings.Join(MTLSModes, ", ")),
				Subject: attrRange(b.Body, "mtls").Ptr()})
		}
	}
	if mb.TrustDomain != nil {
		m.TrustDomain = *mb.TrustDomain
		if m.TrustDomain == "" || strings.ContainsAny(m.TrustDomain, "/:") {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid trust_domain",
				Detail:  fmt.Sprintf("trust_domain = %q: must be a non-empty name without \"/\" or \":\", as in spiffe://TRUST_DOMAIN/ns/NS/sa/SA.", m.TrustDomain),
				Subject: attrRange(b.Body, "trust_domain").Ptr()})
		}
	}
	diags = append(diags, decodeExportTo(mb.ExportTo, exportTo)...)
	loc.Failover = mb.Locality
	if !diags.HasErrors() {
		diags = append(diags, checkFailover(b, mb.Locality != nil, mb.Failover, loc)...)
	}
	return diags
}

// checkFailover checks the failover rules of a mesh block and keeps the
// good ones. As in Istio, a region has one rule and a rule never maps a
// region to itself; rules mean nothing without locality failover, so
// they need the attribute.
func checkFailover(b *hcl.Block, localitySet bool, rules []FailoverRule, loc *Locality) hcl.Diagnostics {
	var diags hcl.Diagnostics
	// gohcl decoded the blocks in file order: their ranges come in the same.
	content, _, _ := b.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "failover"}}})
	seen := map[string]hcl.Range{}
	for i, r := range rules {
		rng := content.Blocks[i].DefRange
		switch {
		case r.From == "" || r.To == "" || strings.Contains(r.From, "/") || strings.Contains(r.To, "/"):
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid failover rule",
				Detail:  fmt.Sprintf("failover { from = %q to = %q }: from and to are region names, not empty and without \"/\".", r.From, r.To),
				Subject: rng.Ptr()})
			continue
		case r.From == r.To:
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid failover rule",
				Detail:  fmt.Sprintf("failover from %q to itself: a region's own endpoints already come first.", r.From),
				Subject: rng.Ptr()})
			continue
		}
		if prev, dup := seen[r.From]; dup {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Duplicate failover rule",
				Detail:  fmt.Sprintf("region %q already fails over by the rule at %s.", r.From, position(prev)),
				Subject: rng.Ptr()})
			continue
		}
		seen[r.From] = rng
		loc.Rules = append(loc.Rules, r)
	}
	if len(content.Blocks) > 0 && !localitySet {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "failover without locality_failover",
			Detail:  "failover rules apply only to locality failover: set locality_failover = true (every service) or false (services that opt in).",
			Subject: content.Blocks[0].DefRange.Ptr()})
	}
	return diags
}

// decodeExportTo reads default_service_export_to, each bad entry an
// error at the entry.
func decodeExportTo(expr hcl.Expression, out *[]string) hcl.Diagnostics {
	if expr == nil {
		return nil
	}
	if v, d := expr.Value(nil); d.HasErrors() || v.IsNull() {
		return d // absent (null), or not a value at all
	}
	elems, diags := hcl.ExprList(expr)
	if diags.HasErrors() {
		return diags
	}
	list := make([]string, len(elems))
	for i, e := range elems {
		if d := gohcl.DecodeExpression(e, nil, &list[i]); d.HasErrors() {
			diags = append(diags, d...)
		}
	}
	if diags.HasErrors() {
		return diags
	}
	if len(list) == 0 {
		return append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Empty default_service_export_to",
			Detail: `default_service_export_to = []: name at least one entry; "~" exports services to no namespace.`, Subject: expr.Range().Ptr()})
	}
	for _, e := range visibility.Validate(list) {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid default_service_export_to",
			Detail:  fmt.Sprintf("default_service_export_to[%d]: %v", e.Index, e.Err),
			Subject: elems[e.Index].Range().Ptr()})
	}
	*out = list
	return diags
}

func decodeXDS(b *hcl.Block, x *XDS) hcl.Diagnostics {
	var xb xdsBlock
	diags := gohcl.DecodeBody(b.Body, nil, &xb)
	if xb.Listen != nil {
		x.Listen = *xb.Listen
		diags = append(diags, checkListen(x.Listen, attrRange(b.Body, "listen"))...)
	}
	if xb.DebounceAfter != nil {
		diags = append(diags, parseDuration(*xb.DebounceAfter, attrRange(b.Body, "debounce_after"), &x.DebounceAfter)...)
	}
	if xb.DebounceMax != nil {
		diags = append(diags, parseDuration(*xb.DebounceMax, attrRange(b.Body, "debounce_max"), &x.DebounceMax)...)
	}
	if xb.MaxConnAge != nil {
		rng := attrRange(b.Body, "max_connection_age")
		d := parseDuration(*xb.MaxConnAge, rng, &x.MaxConnectionAge)
		if !d.HasErrors() && x.MaxConnectionAge > 0 && x.MaxConnectionAge < MinMaxConnectionAge {
			d = append(d, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "max_connection_age is too short",
				Detail:  fmt.Sprintf("%s would have clients reconnect more than they are served; use at least %s, or \"0\" to keep connections.", x.MaxConnectionAge, MinMaxConnectionAge),
				Subject: rng.Ptr()})
		}
		diags = append(diags, d...)
	}
	if xb.DrainGrace != nil {
		diags = append(diags, parseDuration(*xb.DrainGrace, attrRange(b.Body, "drain_grace"), &x.DrainGrace)...)
	}
	if x.DebounceMax < x.DebounceAfter {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "debounce_max is shorter than debounce_after",
			Subject: b.DefRange.Ptr()})
	}
	return append(diags, decodeXDSSecurity(b, &xb, x)...)
}

func decodePlugin(b *hcl.Block, bundled []string) (*Plugin, hcl.Diagnostics) {
	content, diags := b.Body.Content(pluginSchema)
	p := &Plugin{Label: b.Labels[0], DeclRange: b.DefRange, SyncTimeout: DefaultSyncTimeout}
	str := func(name string, dst *string) {
		if a, ok := content.Attributes[name]; ok {
			diags = append(diags, gohcl.DecodeExpression(a.Expr, nil, dst)...)
		}
	}
	str("bundled", &p.Bundled)
	str("path", &p.Path)
	str("sha256", &p.SHA256)
	if a, ok := content.Attributes["args"]; ok {
		diags = append(diags, gohcl.DecodeExpression(a.Expr, nil, &p.Args)...)
	}
	if a, ok := content.Attributes["env"]; ok {
		diags = append(diags, gohcl.DecodeExpression(a.Expr, nil, &p.Env)...)
	}
	if a, ok := content.Attributes["sync_timeout"]; ok {
		var s string
		if d := gohcl.DecodeExpression(a.Expr, nil, &s); d.HasErrors() {
			diags = append(diags, d...)
		} else {
			diags = append(diags, parseDuration(s, a.Expr.Range(), &p.SyncTimeout)...)
		}
	}
	if a, ok := content.Attributes["path"]; ok {
		p.PathRange = a.Expr.Range()
	}
	if a, ok := content.Attributes["sha256"]; ok {
		p.SHA256Range = a.Expr.Range()
	}
	p.Config = hcl.EmptyBody()
	for i, cb := range content.Blocks {
		if i > 0 {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Duplicate config block",
				Detail: fmt.Sprintf("Plugin %q already has a config block.", p.Label), Subject: cb.DefRange.Ptr()})
			continue
		}
		p.Config = cb.Body
	}
	switch {
	case p.Bundled != "" && p.Path != "":
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Both bundled and path are set",
			Detail: "A plugin is either bundled (bundled = \"NAME\") or an external binary (path = \"...\" with sha256), not both.", Subject: p.PathRange.Ptr()})
	case p.Path != "":
		if !filepath.IsAbs(p.Path) {
			// A relative path would be looked up in $PATH or the working
			// directory, which another user may control.
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Plugin path is not absolute",
				Detail: fmt.Sprintf("Plugin %q: path %q must be absolute, for example \"/opt/estuary/plugins/%s\".", p.Label, p.Path, filepath.Base(p.Path)), Subject: p.PathRange.Ptr()})
		}
		if p.SHA256 == "" {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Missing required argument",
				Detail: fmt.Sprintf("External plugin %q needs sha256: the hex SHA-256 of its binary (`sha256sum %s`).", p.Label, p.Path), Subject: b.DefRange.Ptr()})
		} else if _, err := hex.DecodeString(p.SHA256); err != nil || len(p.SHA256) != 64 {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid sha256",
				Detail: "sha256 must be 64 hexadecimal digits.", Subject: p.SHA256Range.Ptr()})
		}
	default:
		name := p.Bundled
		rng := attrRange(b.Body, "bundled")
		if name == "" {
			name, rng = p.Label, b.LabelRanges[0]
		}
		if !contains(bundled, name) {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Unknown bundled plugin",
				Detail:  fmt.Sprintf("No bundled plugin is named %q (bundled: %s). For an external plugin set path and sha256.", name, strings.Join(bundled, ", ")),
				Subject: rng.Ptr()})
		}
		p.Bundled = name
	}
	return p, diags
}

// VerifyBinary checks an external plugin's binary as OpenBinary does,
// without keeping it open: what `estuary validate` does.
func VerifyBinary(p *Plugin) hcl.Diagnostics {
	f, diags := OpenBinary(p)
	if f != nil {
		f.Close()
	}
	return diags
}

// OpenBinary opens an external plugin's binary and checks it: a regular
// file, writable by neither group nor others, owned by root or by the
// host's own user, whose content has the configured sha256. The file it
// returns is the one it hashed; run the plugin from it (on Linux, as
// /proc/self/fd/N), never from its path again, so that a binary swapped
// in at the path after the check is never executed. The caller closes it.
// It returns nil for a bundled plugin.
func OpenBinary(p *Plugin) (*os.File, hcl.Diagnostics) {
	if !p.External() {
		return nil, nil
	}
	bad := func(summary, detail string, rng hcl.Range) hcl.Diagnostics {
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: summary, Detail: fmt.Sprintf("Plugin %q: %s", p.Label, detail), Subject: rng.Ptr()}}
	}
	f, err := os.Open(p.Path)
	if err != nil {
		return nil, bad("Plugin binary not found", err.Error()+".", p.PathRange)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, bad("Cannot read plugin binary", err.Error()+".", p.PathRange)
	}
	if d := checkBinaryFile(p.Path, fi); d != "" {
		f.Close()
		return nil, bad("Unsafe plugin binary", d, p.PathRange)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		f.Close()
		return nil, bad("Cannot read plugin binary", err.Error()+".", p.PathRange)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if !strings.EqualFold(got, p.SHA256) {
		f.Close()
		return nil, bad("Plugin binary checksum mismatch",
			fmt.Sprintf("%s has sha256 %s, but plugins.hcl expects %s. The binary was not started.", p.Path, got, strings.ToLower(p.SHA256)),
			p.SHA256Range)
	}
	return f, nil
}

// checkBinaryFile says what makes a plugin binary unsafe to run, or "".
// Anyone who can write the file, or its owner, could replace what the
// host runs with its privileges.
func checkBinaryFile(path string, fi os.FileInfo) string {
	if !fi.Mode().IsRegular() {
		return fmt.Sprintf("%s is not a regular file.", path)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Sprintf("%s is writable by its group or by others (mode %04o); make it writable by its owner only (chmod go-w).", path, perm)
	}
	if uid, ok := fileOwner(fi); ok && uid != 0 && uid != uint32(os.Getuid()) {
		return fmt.Sprintf("%s is owned by uid %d; it must be owned by root or by the user estuary runs as (uid %d).", path, uid, os.Getuid())
	}
	return ""
}

// DecodeConfig decodes the plugin's config block against its schema.
func (p *Plugin) DecodeConfig(schema *sdk.Schema) hcl.Diagnostics {
	var js []byte
	var diags hcl.Diagnostics
	if p.DecodeCache != nil {
		js, diags = p.DecodeCache.Decode(p.Config, p.source, schema)
	} else {
		js, diags = configschema.Decode(p.Config, schema)
	}
	if !diags.HasErrors() {
		p.ConfigJSON, p.Schema = js, schema
	}
	return diags
}

// ConfigView is the decoded config block as operators may see it: the
// attributes the schema marks sensitive read "(sensitive)" and URLs lose
// their credentials. It is nil until the block is decoded.
func (p *Plugin) ConfigView() json.RawMessage {
	if p.ConfigJSON == nil || p.Schema == nil {
		return nil
	}
	return p.Schema.Redact(p.ConfigJSON)
}

// SensitiveValues lists the values of the block's sensitive attributes,
// once it is decoded, for redacting them from what the host prints.
func (p *Plugin) SensitiveValues() []string {
	if p.ConfigJSON == nil || p.Schema == nil {
		return nil
	}
	return p.Schema.SensitiveValues(p.ConfigJSON)
}

// PluginDiagnostics turns diagnostics a plugin returned from Configure into
// positioned HCL diagnostics inside its config block.
func (p *Plugin) PluginDiagnostics(ds sdk.Diagnostics) hcl.Diagnostics {
	var out hcl.Diagnostics
	for _, d := range ds {
		sev := hcl.DiagError
		if d.Severity == sdk.SeverityWarning {
			sev = hcl.DiagWarning
		}
		rng := configschema.PathRange(p.Config, d.Path)
		out = append(out, &hcl.Diagnostic{Severity: sev, Summary: fmt.Sprintf("plugin %q: %s", p.Label, d.Summary), Detail: d.Detail, Subject: &rng})
	}
	return out
}

func checkListen(addr string, rng hcl.Range) hcl.Diagnostics {
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		var n int
		n, err = strconv.Atoi(port)
		if err == nil && (n < 0 || n > 65535) {
			err = fmt.Errorf("port %d is out of range", n)
		}
	}
	if err == nil && host != "" && host != "localhost" && net.ParseIP(host) == nil {
		err = fmt.Errorf("%q is not an IP address", host)
	}
	if err != nil {
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Invalid listen address",
			Detail: fmt.Sprintf("%q: %v; want HOST:PORT, for example 127.0.0.1:15010.", addr, err), Subject: rng.Ptr()}}
	}
	return nil
}

func parseDuration(s string, rng hcl.Range, dst *time.Duration) hcl.Diagnostics {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Invalid duration",
			Detail: fmt.Sprintf("%q is not a duration such as \"100ms\" or \"30s\".", s), Subject: rng.Ptr()}}
	}
	*dst = d
	return nil
}

func attrRange(body hcl.Body, name string) hcl.Range {
	attrs, _ := body.JustAttributes()
	if a, ok := attrs[name]; ok {
		return a.Expr.Range()
	}
	return body.MissingItemRange()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Format renders diagnostics one per line as FILE:LINE:COL: summary: detail.
func Format(diags hcl.Diagnostics) string {
	var b strings.Builder
	for _, d := range diags {
		sev := "error"
		if d.Severity == hcl.DiagWarning {
			sev = "warning"
		}
		if d.Subject != nil {
			fmt.Fprintf(&b, "%s:%d:%d: ", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column)
		}
		fmt.Fprintf(&b, "%s: %s", sev, d.Summary)
		if d.Detail != "" {
			fmt.Fprintf(&b, ": %s", strings.TrimSuffix(d.Detail, "."))
		}
		b.WriteByte('\n')
	}
	return b.String()
}
