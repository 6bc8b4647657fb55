package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Kubeconfig features a remote secret may use only when the operator lists
// them in allow_kubeconfig_options: each runs a program or reads a file of
// the control plane's host, which a secret's author must not be able to
// make it do. The names are the kubeconfig's own field names.
const (
	optExec                 = "exec"
	optTokenFile            = "tokenFile"
	optClientCertificate    = "client-certificate"
	optClientKey            = "client-key"
	optCertificateAuthority = "certificate-authority"
)

// kubeconfigOptions lists the values allow_kubeconfig_options accepts.
var kubeconfigOptions = []string{
	optExec, optTokenFile, optClientCertificate, optClientKey, optCertificateAuthority,
}

// noAuthProvider says why a kubeconfig's auth-provider is refused: no
// client-go auth provider is compiled in. client-go deprecated them (the
// gcp and azure ones are gone), and oidc's would fetch its issuer's URL,
// which a secret's author chooses, from the control plane. A credential
// plugin (exec) does the same job under the operator's control.
const noAuthProvider = "no kubeconfig auth-provider is compiled into estuary; give the kubeconfig a token or a client certificate, " +
	`or a credential plugin such as kubelogin for OIDC (users[].user.exec, with allow_kubeconfig_options = ["exec"])`

// kubeconfigPolicy says what a kubeconfig from a remote secret may do.
type kubeconfigPolicy struct {
	allowed map[string]bool
	// servers, if not nil, lists the API servers remote kubeconfigs may name.
	servers *serverAllowList
	// hostAddrs are the host's own listen addresses
	// (MeshSettings.HostAddresses), never a remote API server.
	hostAddrs []string
	// localAddrs lists this machine's addresses, for a host address
	// bound to 0.0.0.0 or ::; nil asks the kernel. Tests set it.
	localAddrs func() []netip.Addr
}

// deniedPrefixes are never API servers or proxies, whatever
// allowed_servers allows broadly: link-local addresses, where clouds serve
// instance metadata and credentials (169.254.169.254, and AWS's IPv6
// fd00:ec2::254), and the unspecified addresses, which reach this
// machine. An allowed_servers entry inside one of them (say
// "169.254.10.5") allows that much, for the rare cluster really there.
var deniedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
	netip.MustParsePrefix("0.0.0.0/32"),
	netip.MustParsePrefix("::/128"),
}

// restConfig parses a kubeconfig from a remote secret, checks it against
// the policy and returns its current context's client config. Errors name
// the kubeconfig's entries and options, never their values.
func (p *kubeconfigPolicy) restConfig(data []byte) (*rest.Config, error) {
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return nil, fmt.Errorf("%w: not a kubeconfig: %w", ErrKubeconfigRejected, err)
	}
	if err := p.check(cfg); err != nil {
		return nil, err
	}
	// A direct (non-deferred) config never falls back to in-cluster
	// credentials when the kubeconfig is empty.
	rc, err := clientcmd.NewNonInteractiveClientConfig(*cfg, cfg.CurrentContext, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKubeconfigRejected, err)
	}
	rc.Dial = p.dialer()
	return rc, nil
}

// dialer connects the client of a remote kubeconfig, checking the address
// it really connects to: a host name checked above only as written may
// resolve to a metadata address or to the host itself.
func (p *kubeconfigPolicy) dialer() func(ctx context.Context, network, address string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			host, port, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			ip, err := netip.ParseAddr(host)
			if err != nil {
				return err
			}
			if why := p.refusedAddr(ip, port); why != "" {
				return fmt.Errorf("%w: connecting to %s, %s", ErrKubeconfigRejected, address, why)
			}
			return nil
		}}
	return d.DialContext
}

// check lists every forbidden feature of cfg, in a stable order.
func (p *kubeconfigPolicy) check(cfg *clientcmdapi.Config) error {
	var errs []error
	deny := func(what, option string) {
		if !p.allowed[option] {
			errs = append(errs, fmt.Errorf("%w: %s uses %q, which allow_kubeconfig_options does not list", ErrKubeconfigRejected, what, option))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.AuthInfos)) {
		u := cfg.AuthInfos[name]
		if u == nil {
			continue
		}
		what := fmt.Sprintf("user %q", name)
		if u.Exec != nil {
			deny(what, optExec)
		}
		if ap := u.AuthProvider; ap != nil {
			errs = append(errs, fmt.Errorf("%w: %s uses auth-provider %q: %s", ErrKubeconfigRejected, what, ap.Name, noAuthProvider))
		}
		if u.TokenFile != "" {
			deny(what, optTokenFile)
		}
		if u.ClientCertificate != "" {
			deny(what, optClientCertificate)
		}
		if u.ClientKey != "" {
			deny(what, optClientKey)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Clusters)) {
		c := cfg.Clusters[name]
		if c == nil {
			continue
		}
		what := fmt.Sprintf("cluster %q", name)
		if c.CertificateAuthority != "" {
			deny(what, optCertificateAuthority)
		}
		if err := p.checkServer(what, "server", c.Server); err != nil {
			errs = append(errs, err)
		}
		if c.ProxyURL != "" {
			if err := p.checkServer(what, "proxy-url", c.ProxyURL); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// checkServer checks a URL the client would connect to: never a
// link-local or metadata address nor the host itself, and inside
// allowed_servers when it is set. It prints only scheme, host and port: a
// URL may carry a password.
func (p *kubeconfigPolicy) checkServer(what, field, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return fmt.Errorf("%w: %s: %s is not a URL with a host", ErrKubeconfigRejected, what, field)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "socks5": "1080"}[u.Scheme]
		if port == "" {
			port = "443"
		}
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(strings.Trim(u.Hostname(), "[]")); err == nil {
		ips = []netip.Addr{ip}
	} else if strings.EqualFold(strings.TrimSuffix(u.Hostname(), "."), "localhost") {
		ips = []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	}
	for _, ip := range ips {
		if why := p.refusedAddr(ip, port); why != "" {
			return fmt.Errorf("%w: %s: %s %s://%s is refused: %s", ErrKubeconfigRejected, what, field, u.Scheme, u.Host, why)
		}
	}
	if p.servers != nil && !p.servers.allows(u.Hostname()) {
		return fmt.Errorf("%w: %s: %s %s://%s is outside allowed_servers", ErrKubeconfigRejected, what, field, u.Scheme, u.Host)
	}
	return nil
}

// refusedAddr says why the client may not connect to ip:port, or "".
func (p *kubeconfigPolicy) refusedAddr(ip netip.Addr, port string) string {
	ip = ip.Unmap().WithZone("")
	for _, d := range deniedPrefixes {
		if d.Contains(ip) && !p.servers.allowsWithin(d, ip) {
			return fmt.Sprintf("%s is a link-local, metadata or unspecified address (%s); list it in allowed_servers if a cluster really is there", ip, d)
		}
	}
	for _, h := range p.hostAddrs {
		if p.isHostAddr(h, ip, port) {
			return fmt.Sprintf("%s:%s is where estuary itself listens", ip, port)
		}
	}
	return ""
}

// isHostAddr reports whether ip:port reaches the host listening on
// listen ("HOST:PORT" as bound).
func (p *kubeconfigPolicy) isHostAddr(listen string, ip netip.Addr, port string) bool {
	host, lport, err := net.SplitHostPort(listen)
	if err != nil || lport != port {
		return false
	}
	lip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	lip = lip.Unmap().WithZone("")
	if !lip.IsUnspecified() {
		return lip == ip
	}
	// Bound to every address: any of this machine's reaches it.
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	local := p.localAddrs
	if local == nil {
		local = machineAddrs
	}
	return slices.Contains(local(), ip)
}

// machineAddrs lists this machine's interface addresses.
func machineAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap().WithZone(""))
		}
	}
	return out
}

// serverAllowList is allowed_servers: CIDRs (or single IPs) for servers
// named by IP, host names (exact, or "*.example.com" for any name below
// example.com) for servers named by host name. Host names are compared as
// written; they are not resolved.
type serverAllowList struct {
	prefixes []netip.Prefix
	hosts    []string // lower case
}

// parseAllowedServers parses allowed_servers; errs[i] is non-nil for each
// entry that is neither a CIDR, an IP nor a host name.
func parseAllowedServers(entries []string) (*serverAllowList, map[int]error) {
	a := &serverAllowList{}
	errs := map[int]error{}
	for i, e := range entries {
		e = strings.TrimSpace(e)
		if p, err := netip.ParsePrefix(e); err == nil {
			a.prefixes = append(a.prefixes, p.Masked())
			continue
		}
		if ip, err := netip.ParseAddr(e); err == nil {
			a.prefixes = append(a.prefixes, netip.PrefixFrom(ip, ip.BitLen()))
			continue
		}
		h := strings.ToLower(e)
		if msgs := validation.IsDNS1123Subdomain(strings.TrimPrefix(h, "*.")); len(msgs) > 0 {
			errs[i] = fmt.Errorf("%q is neither a CIDR, an IP address nor a host name", e)
			continue
		}
		a.hosts = append(a.hosts, h)
	}
	return a, errs
}

// allowsWithin reports whether an entry inside the denied range d (not a
// broader one, such as 0.0.0.0/0) allows ip.
func (a *serverAllowList) allowsWithin(d netip.Prefix, ip netip.Addr) bool {
	if a == nil {
		return false
	}
	return slices.ContainsFunc(a.prefixes, func(p netip.Prefix) bool {
		return p.Bits() >= d.Bits() && d.Contains(p.Addr()) && p.Contains(ip)
	})
}

func (a *serverAllowList) allows(host string) bool {
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		ip = ip.Unmap().WithZone("")
		return slices.ContainsFunc(a.prefixes, func(p netip.Prefix) bool { return p.Contains(ip) })
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, h := range a.hosts {
		if suffix, ok := strings.CutPrefix(h, "*"); ok {
			if strings.HasSuffix(host, suffix) && len(host) > len(suffix) {
				return true
			}
		} else if h == host {
			return true
		}
	}
	return false
}

// CheckRemoteKubeconfig checks a remote secret's kubeconfig as a plugin
// with the default config checks it: no kubeconfig option allowed, no
// allowed_servers list. `estuary create-remote-secret` runs it on what it
// is about to print, so it never hands an operator a secret the plugin
// would refuse. The host's own listen addresses are unknown here; the
// plugin checks them again when it reads the secret.
func CheckRemoteKubeconfig(data []byte) error {
	p := kubeconfigPolicy{allowed: map[string]bool{}}
	_, err := p.restConfig(data)
	return err
}
