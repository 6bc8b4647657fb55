package kubernetes

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"slices"
	"strings"

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
	optExec                    = "exec"
	optAuthProvider            = "auth-provider" // any provider other than oidc
	optTokenFile               = "tokenFile"
	optClientCertificate       = "client-certificate"
	optClientKey               = "client-key"
	optCertificateAuthority    = "certificate-authority"
	optIDPCertificateAuthority = "idp-certificate-authority" // a file named in oidc's config
)

// kubeconfigOptions lists the values allow_kubeconfig_options accepts.
var kubeconfigOptions = []string{
	optExec, optAuthProvider, optTokenFile, optClientCertificate, optClientKey,
	optCertificateAuthority, optIDPCertificateAuthority,
}

// kubeconfigPolicy says what a kubeconfig from a remote secret may do.
type kubeconfigPolicy struct {
	allowed map[string]bool
	// servers, if not nil, lists the API servers remote kubeconfigs may name.
	servers *serverAllowList
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
	return rc, nil
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
			if ap.Name != "oidc" {
				deny(fmt.Sprintf("%s (auth-provider %q)", what, ap.Name), optAuthProvider)
			} else if ap.Config["idp-certificate-authority"] != "" {
				deny(what+" (oidc)", optIDPCertificateAuthority)
			}
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

// checkServer checks a URL the client would connect to against
// allowed_servers. It prints only scheme, host and port: a URL may carry a
// password.
func (p *kubeconfigPolicy) checkServer(what, field, raw string) error {
	if p.servers == nil {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return fmt.Errorf("%w: %s: %s is not a URL with a host", ErrKubeconfigRejected, what, field)
	}
	if !p.servers.allows(u.Hostname()) {
		return fmt.Errorf("%w: %s: %s %s://%s is outside allowed_servers", ErrKubeconfigRejected, what, field, u.Scheme, u.Host)
	}
	return nil
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
