package istio

import (
	"slices"
	"strings"
)

// Protocol is a port protocol in Istio's spelling ("HTTP", "GRPC-Web", ...),
// the spelling sdk.Port.Protocol carries.
type Protocol string

// The protocols Istio knows. Unsupported is what Istio answers for any
// other name; it is not a protocol a port can declare.
const (
	TCP         Protocol = "TCP"
	UDP         Protocol = "UDP"
	GRPC        Protocol = "GRPC"
	GRPCWeb     Protocol = "GRPC-Web"
	HTTP        Protocol = "HTTP"
	HTTPProxy   Protocol = "HTTP_PROXY"
	HTTP2       Protocol = "HTTP2"
	HTTPS       Protocol = "HTTPS"
	TLS         Protocol = "TLS"
	Mongo       Protocol = "Mongo"
	Redis       Protocol = "Redis"
	MySQL       Protocol = "MySQL"
	Unsupported Protocol = "UnsupportedProtocol"
)

// known lists the protocols Istio knows, in the order protocol.Parse
// checks them.
var known = []Protocol{TCP, UDP, GRPC, GRPCWeb, HTTP, HTTPProxy, HTTP2, HTTPS, TLS, Mongo, Redis, MySQL}

// protocols indexes the known protocols by their lower-case name.
var protocols = func() map[string]Protocol {
	m := map[string]Protocol{}
	for _, p := range known {
		m[strings.ToLower(string(p))] = p
	}
	return m
}()

// KnownProtocols lists the protocols Istio knows, for messages that tell an
// operator what to write instead.
func KnownProtocols() []Protocol { return slices.Clone(known) }

// ParseProtocol reads a protocol name as Istio's protocol.Parse does:
// ignoring case, and only whole names ("http-web" is Unsupported here; see
// PortNameProtocol for the port-naming rule).
func ParseProtocol(s string) Protocol {
	if p, ok := protocols[strings.ToLower(s)]; ok {
		return p
	}
	return Unsupported
}

// Known reports whether p is a protocol Istio knows.
func (p Protocol) Known() bool { return p != Unsupported && p != "" }

// OrTCP returns p, or TCP for a protocol Istio does not know. Istio would
// sniff such a port; Estuary's registries report it as TCP, the protocol a
// proxy that does not sniff treats it as.
func (p Protocol) OrTCP() Protocol {
	if !p.Known() {
		return TCP
	}
	return p
}

// grpcWebPrefix is checked before the general '-' rule, because the
// protocol's own name contains a '-'.
var grpcWebPrefix = strings.ToLower(string(GRPCWeb))

// PortNameProtocol applies Istio's port-naming convention, <protocol>[-<suffix>]:
// a name that starts with "grpc-web" (any case) is GRPC-Web, "grpc-web-x"
// included; otherwise the part before the first '-' is parsed, so
// "http-admin" is HTTP, "http2" is HTTP2 and "grpcweb-x" or "admin" are
// Unsupported.
func PortNameProtocol(name string) Protocol {
	if len(name) >= len(grpcWebPrefix) && strings.EqualFold(name[:len(grpcWebPrefix)], grpcWebPrefix) {
		return GRPCWeb
	}
	prefix, _, _ := strings.Cut(name, "-")
	return ParseProtocol(prefix)
}

// kubeAppProtocols are the application protocols Kubernetes itself defines
// (KEP-3726). Istio maps them before any naming rule.
var kubeAppProtocols = map[string]Protocol{
	"kubernetes.io/h2c": HTTP2,
	"kubernetes.io/ws":  HTTP,
	"kubernetes.io/wss": HTTPS,
}

// wellKnownPorts are ports whose servers speak first (SMTP, DNS, MySQL,
// MongoDB): sniffing would break them, so Istio calls them TCP when their
// name says nothing.
var wellKnownPorts = map[uint32]bool{25: true, 53: true, 3306: true, 27017: true}

// ServicePort is what Istio reads from a Kubernetes-style service port to
// choose its protocol.
type ServicePort struct {
	// Name is the port's name, e.g. "http-web".
	Name string
	// Number is the service port.
	Number uint32
	// Transport is the port's L4 protocol as Kubernetes spells it: "TCP"
	// (or empty), "UDP" or "SCTP".
	Transport string
	// AppProtocol is the port's appProtocol; nil when unset. When set it
	// replaces the name, even if it names nothing Istio knows.
	AppProtocol *string
}

// Protocol is Istio's choice for the port (kube.ConvertProtocol): UDP for a
// UDP port; else a Kubernetes-defined appProtocol (kubernetes.io/h2c, ws,
// wss); else PortNameProtocol of the appProtocol or, without one, of the
// name; and a port whose name says nothing is TCP on a well-known port,
// Unsupported elsewhere.
func (sp ServicePort) Protocol() Protocol {
	if sp.Transport == "UDP" {
		return UDP
	}
	name := sp.Name
	if sp.AppProtocol != nil {
		name = *sp.AppProtocol
		if p, ok := kubeAppProtocols[name]; ok {
			return p
		}
	}
	p := PortNameProtocol(name)
	if p == Unsupported && wellKnownPorts[sp.Number] {
		return TCP
	}
	return p
}
