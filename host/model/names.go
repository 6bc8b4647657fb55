package model

import (
	"strconv"
	"strings"
)

// SubsetLabel is the endpoint label whose values name a service's subsets:
// each distinct value V gets a cluster outbound|PORT|V|HOST.
const SubsetLabel = "version"

// ClusterName is Istio's outbound cluster name: outbound|PORT|SUBSET|HOST.
func ClusterName(port uint32, subset, host string) string {
	return "outbound|" + strconv.FormatUint(uint64(port), 10) + "|" + subset + "|" + host
}

// ParseClusterName splits an outbound cluster name.
func ParseClusterName(name string) (port uint32, subset, host string, ok bool) {
	rest, found := strings.CutPrefix(name, "outbound|")
	if !found {
		return 0, "", "", false
	}
	ps, rest, found1 := strings.Cut(rest, "|")
	subset, host, found2 := strings.Cut(rest, "|")
	if !found1 || !found2 {
		return 0, "", "", false
	}
	p, err := strconv.ParseUint(ps, 10, 32)
	if err != nil {
		return 0, "", "", false
	}
	return uint32(p), subset, host, true
}

// SNIClusterName is the name of an east-west gateway cluster, which is
// also the SNI it matches: outbound_.PORT_.SUBSET_.HOST, which is
// outbound_.PORT_._.HOST without a subset (Istio's form).
func SNIClusterName(port uint32, subset, host string) string {
	return "outbound_." + strconv.FormatUint(uint64(port), 10) + "_." + subset + "_." + host
}

// ParseSNIClusterName splits an SNI cluster name.
func ParseSNIClusterName(name string) (port uint32, subset, host string, ok bool) {
	rest, found := strings.CutPrefix(name, "outbound_.")
	if !found {
		return 0, "", "", false
	}
	ps, rest, found1 := strings.Cut(rest, "_.")
	subset, host, found2 := strings.Cut(rest, "_.")
	if !found1 || !found2 || host == "" {
		return 0, "", "", false
	}
	p, err := strconv.ParseUint(ps, 10, 32)
	if err != nil {
		return 0, "", "", false
	}
	return uint32(p), subset, host, true
}

// ListenerName is the proxyless gRPC listener of a service port: the target
// a client dials as xds:///HOST:PORT.
func ListenerName(host string, port uint32) string {
	return host + ":" + strconv.FormatUint(uint64(port), 10)
}
