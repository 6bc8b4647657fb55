package consul

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/estuary-mesh/estuary/sdk"
)

// Defaults of the config block.
const (
	defaultDomainSuffix = "service.consul"
	defaultWaitTime     = 5 * time.Minute
	// maxWaitTime is the longest wait Consul accepts on a blocking query.
	maxWaitTime        = 10 * time.Minute
	defaultRateLimit   = 1000
	defaultMaxWatchers = 1000
	healthPassing      = "passing"
	healthWarning      = "passing_and_warning"
)

var schema = &sdk.Schema{Attributes: []sdk.Attribute{
	{Name: "address", Type: "string", Description: `HTTP address of the Consul agent, "host:port", "https://host:port" or "unix:///path"; default CONSUL_HTTP_ADDR, else localhost:8500, as the consul CLI`},
	{Name: "scheme", Type: "string", Description: `"http" (default) or "https"`},
	{Name: "datacenters", Type: "list(string)", Description: "datacenters to watch, one instance each; empty means the agent's own"},
	{Name: "peers", Type: "list(string)", Description: `cluster peers whose imported services to watch (?peer=NAME), one instance each, Cluster = the peer's name; "*" is every peering the agent lists when the config is applied`},
	{Name: "token", Type: "string", Sensitive: true, Description: "ACL token; sensitive: never shown or logged. Default CONSUL_HTTP_TOKEN"},
	{Name: "token_file", Type: "string", Sensitive: true, Description: "file holding the ACL token, re-read when Consul answers 403; sensitive"},
	{Name: "ca_file", Type: "string", Description: "PEM CA bundle that signs the agent's HTTPS certificate"},
	{Name: "cert_file", Type: "string", Description: "PEM client certificate, with key_file"},
	{Name: "key_file", Type: "string", Sensitive: true, Description: "PEM client key, with cert_file; sensitive"},
	{Name: "server_name", Type: "string", Description: "TLS server name to verify the agent's certificate against"},
	{Name: "namespace", Type: "string", Description: "Consul Enterprise namespace to watch (default \"default\"); the same as namespaces = [NAME]"},
	{Name: "namespaces", Type: "list(string)", Description: `Consul Enterprise namespaces to watch, each with its own queries and the services' namespace; "*" is every namespace the agent lists when the config is applied (on Consul CE: "default"). Not with namespace`},
	{Name: "partition", Type: "string", Description: "Consul Enterprise admin partition to watch (default \"default\"); the same as partitions = [NAME]"},
	{Name: "partitions", Type: "list(string)", Description: `Consul Enterprise admin partitions to watch, every namespace in each; "*" is every partition the agent lists when the config is applied (on Consul CE: "default"). Not with partition`},
	{Name: "domain_suffix", Type: "string", Description: `hostnames are SERVICE.<domain_suffix>; default "service.consul"`},
	{Name: "health", Type: "string", Description: `which instances become endpoints: "passing" (default) or "passing_and_warning"`},
	{Name: "tag_filter", Type: "list(string)", Description: "only instances carrying every one of these tags"},
	{Name: "network", Type: "string", Description: "default network of the endpoints; default mesh.network for the datacenter named mesh.cluster_id, none for the others (the networks block decides)"},
	{Name: "wait_time", Type: sdk.TypeDuration, Description: `longest a blocking query waits, e.g. "5m" (default, at most 10m)`},
	{Name: "rate_limit", Type: "number", Description: "requests per second to Consul, shared by all watches (default 1000)"},
	{Name: "max_watchers", Type: "number", Description: "most per-service watches per datacenter (default 1000); each holds one connection to the agent"},
}}

// config is the decoded `config { }` block; unset attributes are nil.
type config struct {
	Address      *string       `json:"address"`
	Scheme       *string       `json:"scheme"`
	Datacenters  []string      `json:"datacenters"`
	Peers        []string      `json:"peers"`
	Token        *string       `json:"token"`
	TokenFile    *string       `json:"token_file"`
	CAFile       *string       `json:"ca_file"`
	CertFile     *string       `json:"cert_file"`
	KeyFile      *string       `json:"key_file"`
	ServerName   *string       `json:"server_name"`
	Namespace    *string       `json:"namespace"`
	Namespaces   []string      `json:"namespaces"`
	Partition    *string       `json:"partition"`
	Partitions   []string      `json:"partitions"`
	DomainSuffix *string       `json:"domain_suffix"`
	Health       *string       `json:"health"`
	TagFilter    []string      `json:"tag_filter"`
	Network      *string       `json:"network"`
	WaitTime     *sdk.Duration `json:"wait_time"`
	RateLimit    *float64      `json:"rate_limit"`
	MaxWatchers  *float64      `json:"max_watchers"`
}

// settings is a validated config, ready to run.
type settings struct {
	// api is the client config: address, scheme and TLS files, with the
	// consul CLI's environment variables as defaults. Its namespace and
	// partition stay empty: each query names its scope.
	api          api.Config
	tls          *tls.Config // nil for plain HTTP
	token        string
	tokenFile    string
	datacenters  []string // empty: the agent's own
	peers        []string // peers named in the config
	allPeers     bool     // "*": every peering the agent lists
	domainSuffix string
	warning      bool // include warning instances
	tagFilter    []string
	network      string           // the network setting; empty: see mesh
	mesh         sdk.MeshSettings // mesh.network is the default of the datacenter named mesh.cluster_id only
	waitTime     time.Duration
	rateLimit    float64
	maxWatchers  int

	// namespaces and partitions are Consul's names, "default" included;
	// all* adds, for "*", every one the agent lists.
	namespaces, partitions       []string
	allNamespaces, allPartitions bool
}

// parseConfig validates cfg and reports every problem with its path.
// Unset attributes fall back to the consul CLI's environment variables
// (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_CACERT, ...), then to the
// defaults above.
func parseConfig(cfg *config, mesh sdk.MeshSettings) (*settings, sdk.Diagnostics) {
	var diags sdk.Diagnostics
	base := api.DefaultConfig() // reads the environment, as the consul CLI does
	s := &settings{
		api: api.Config{
			Address:   base.Address,
			Scheme:    base.Scheme,
			HttpAuth:  base.HttpAuth,
			TLSConfig: base.TLSConfig,
		},
		token:        base.Token,
		tokenFile:    base.TokenFile,
		domainSuffix: defaultDomainSuffix,
		mesh:         mesh,
		waitTime:     defaultWaitTime,
		rateLimit:    defaultRateLimit,
		maxWatchers:  defaultMaxWatchers,
	}
	if cfg.Address != nil {
		if strings.TrimSpace(*cfg.Address) == "" {
			diags.Errorf([]string{"address"}, "address must not be empty")
		}
		s.api.Address = *cfg.Address
	}
	// Credentials in the address ("https://user:pass@host:8501") become
	// HTTP basic auth, as CONSUL_HTTP_AUTH would: the client quotes its
	// address in every error, which must not carry them.
	if u, err := url.Parse(s.api.Address); err == nil && u.User != nil && u.Host != "" {
		pass, _ := u.User.Password()
		s.api.HttpAuth = &api.HttpBasicAuth{Username: u.User.Username(), Password: pass}
		u.User = nil
		s.api.Address = u.String()
	}
	if cfg.Scheme != nil {
		switch *cfg.Scheme {
		case "http", "https":
			s.api.Scheme = *cfg.Scheme
		default:
			diags.Errorf([]string{"scheme"}, "scheme %q is not \"http\" or \"https\"", *cfg.Scheme)
		}
	}
	seen := map[string]bool{}
	for i, dc := range cfg.Datacenters {
		path := []string{"datacenters", strconv.Itoa(i)}
		switch {
		case strings.TrimSpace(dc) == "":
			diags.Errorf(path, "datacenter name must not be empty")
		case seen[dc]:
			diags.Errorf(path, "datacenter %q is listed twice", dc)
		default:
			seen[dc] = true
			s.datacenters = append(s.datacenters, dc)
		}
	}

	seenPeer := map[string]bool{}
	for i, peer := range cfg.Peers {
		path := []string{"peers", strconv.Itoa(i)}
		switch {
		case peer == "*":
			s.allPeers = true
		case strings.TrimSpace(peer) == "":
			diags.Errorf(path, "peer name must not be empty")
		case seenPeer[peer]:
			diags.Errorf(path, "peer %q is listed twice", peer)
		case seen[peer]:
			// Both would be the instance of Cluster = the name.
			diags.Errorf(path, "peer %q has the name of a listed datacenter: both would be instance %q", peer, peer)
		default:
			seenPeer[peer] = true
			s.peers = append(s.peers, peer)
		}
	}

	// Token: explicit settings replace the environment's as a pair.
	if cfg.Token != nil || cfg.TokenFile != nil {
		s.token, s.tokenFile = "", ""
	}
	if cfg.Token != nil && cfg.TokenFile != nil {
		diags.Errorf([]string{"token_file"}, "set token or token_file, not both")
	}
	if cfg.Token != nil {
		s.token = *cfg.Token
	}
	if cfg.TokenFile != nil {
		s.tokenFile = *cfg.TokenFile
	}
	if s.tokenFile != "" {
		tok, err := readToken(s.tokenFile)
		if err != nil {
			diags.Errorf([]string{"token_file"}, "%v", err)
		}
		s.token = tok
	}

	// TLS.
	setIf(&s.api.TLSConfig.CAFile, cfg.CAFile)
	setIf(&s.api.TLSConfig.CertFile, cfg.CertFile)
	setIf(&s.api.TLSConfig.KeyFile, cfg.KeyFile)
	setIf(&s.api.TLSConfig.Address, cfg.ServerName)
	if strings.HasPrefix(s.api.Address, "https://") {
		s.api.Scheme = "https"
	}
	explicitTLS := cfg.CAFile != nil || cfg.CertFile != nil || cfg.KeyFile != nil || cfg.ServerName != nil
	switch {
	case s.api.Scheme == "https":
		s.tls = buildTLS(&s.api.TLSConfig, &diags)
	case explicitTLS:
		diags.Errorf([]string{"scheme"}, "TLS settings are given but the scheme is %q; set scheme = \"https\"", s.api.Scheme)
	}

	s.namespaces, s.allNamespaces = scopeNames(&diags, "namespace", cfg.Namespace, cfg.Namespaces, base.Namespace)
	s.partitions, s.allPartitions = scopeNames(&diags, "partition", cfg.Partition, cfg.Partitions, base.Partition)
	if cfg.DomainSuffix != nil {
		suffix := strings.Trim(*cfg.DomainSuffix, ".")
		if suffix == "" || strings.ContainsAny(suffix, " /:") {
			diags.Errorf([]string{"domain_suffix"}, "domain_suffix %q is not a DNS suffix such as \"service.consul\"", *cfg.DomainSuffix)
		}
		s.domainSuffix = suffix
	}
	if cfg.Health != nil {
		switch *cfg.Health {
		case healthPassing:
		case healthWarning:
			s.warning = true
		default:
			diags.Errorf([]string{"health"}, "health %q is not %q or %q", *cfg.Health, healthPassing, healthWarning)
		}
	}
	for i, tag := range cfg.TagFilter {
		if tag == "" {
			diags.Errorf([]string{"tag_filter", strconv.Itoa(i)}, "tag must not be empty")
		}
	}
	s.tagFilter = slices.Clone(cfg.TagFilter)
	setIf(&s.network, cfg.Network)
	if cfg.WaitTime != nil {
		switch d := cfg.WaitTime.Duration; {
		case d < time.Second || d > maxWaitTime:
			diags.Errorf([]string{"wait_time"}, "wait_time %s is not between 1s and %s (Consul's maximum)", d, maxWaitTime)
		default:
			s.waitTime = d
		}
	}
	if cfg.RateLimit != nil {
		if *cfg.RateLimit <= 0 {
			diags.Errorf([]string{"rate_limit"}, "rate_limit %v must be above 0 requests per second", *cfg.RateLimit)
		}
		s.rateLimit = *cfg.RateLimit
	}
	if cfg.MaxWatchers != nil {
		n := *cfg.MaxWatchers
		if n < 1 || n > 1e6 || n != float64(int(n)) {
			diags.Errorf([]string{"max_watchers"}, "max_watchers %v is not a whole number between 1 and 1000000", n)
		}
		s.maxWatchers = int(n)
	}
	return s, diags
}

// scopeNames validates the namespaces (or partitions) of the block: the
// singular attribute, or the plural list, else the environment's
// CONSUL_NAMESPACE (CONSUL_PARTITION), else "default". "*" sets all.
// Names become hostname labels, so two that differ in case only are the
// same name.
func scopeNames(diags *sdk.Diagnostics, singular string, one *string, list []string, env string) (names []string, all bool) {
	plural := singular + "s"
	var paths [][]string
	switch {
	case one != nil && list != nil:
		diags.Errorf([]string{plural}, "set %s or %s, not both", singular, plural)
		return nil, false
	case one != nil:
		list, paths = []string{*one}, [][]string{{singular}}
	case list != nil:
		for i := range list {
			paths = append(paths, []string{plural, strconv.Itoa(i)})
		}
	case env != "":
		list, paths = []string{env}, [][]string{{singular}}
	}
	for i, name := range list {
		switch {
		case name == "*":
			all = true
		case !validScopeName(name):
			diags.Errorf(paths[i], "%s %q is not a Consul %s name: letters, digits and \"-\", at most 63, starting and ending with a letter or digit", singular, name, singular)
		case slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, name) }):
			diags.Errorf(paths[i], "%s %q is listed twice", singular, name)
		default:
			names = append(names, name)
		}
	}
	if len(names) == 0 && !all {
		names = []string{defaultName}
	}
	return names, all
}

// peerScope is where peerings = ["*"] lists the peerings: the block's
// partition when it names exactly one, else the default one.
func (s *settings) peerScope() scope {
	if len(s.partitions) == 1 && !s.allPartitions {
		return scope{partition: s.partitions[0], namespace: defaultName}
	}
	return defaultScope
}

// readToken reads an ACL token file. The error never quotes the content.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

// buildTLS loads the TLS files, reporting each bad one at its attribute.
func buildTLS(c *api.TLSConfig, diags *sdk.Diagnostics) *tls.Config {
	conf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.InsecureSkipVerify} //nolint:gosec // only from CONSUL_HTTP_SSL_VERIFY=false
	if c.Address != "" {
		conf.ServerName = c.Address
	}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		pool := x509.NewCertPool()
		switch {
		case err != nil:
			diags.Errorf([]string{"ca_file"}, "read CA file: %v", err)
		case !pool.AppendCertsFromPEM(pem):
			diags.Errorf([]string{"ca_file"}, "CA file %s holds no PEM certificate", c.CAFile)
		default:
			conf.RootCAs = pool
		}
	}
	switch {
	case c.CertFile != "" && c.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			diags.Errorf([]string{"cert_file"}, "load client certificate %s with key %s: %v", c.CertFile, c.KeyFile, err)
		}
		conf.Certificates = []tls.Certificate{cert}
	case c.CertFile != "":
		diags.Errorf([]string{"key_file"}, "cert_file is set without key_file")
	case c.KeyFile != "":
		diags.Errorf([]string{"cert_file"}, "key_file is set without cert_file")
	}
	return conf
}

func setIf(dst *string, v *string) {
	if v != nil {
		*dst = *v
	}
}
