// Command estuary is the Estuary control plane: a plugin host that merges
// service registries and serves them over xDS.
//
//	estuary run -config plugins.hcl        run the host
//	estuary validate -config plugins.hcl   check a file without starting anything
//	estuary plugins [-config plugins.hcl]  list bundled and configured plugins
//	estuary explain endpoint --node ID --cluster 'outbound|PORT||HOST'
//	estuary explain service HOST --node ID
//	                                       why a node gets the endpoints it gets
//	estuary create-remote-secret --name CLUSTER_ID [--context CTX]
//	                                       print a remote secret for a member cluster
//	estuary plugin NAME                    (hidden) serve a bundled plugin
package main

import (
	"fmt"
	"os"

	"github.com/estuary-mesh/estuary/host/supervisor"
	"github.com/estuary-mesh/estuary/plugins/bundled"
)

// Version of the estuary binary.
var Version = "0.1.0-dev"

var catalog = supervisor.Catalog(bundled.Factories)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		usage()
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return runHost(rest)
	case "validate":
		return validate(rest)
	case "plugins":
		return listPlugins(rest)
	case "plugin":
		if len(rest) != 1 {
			fmt.Fprintln(os.Stderr, "usage: estuary plugin NAME (started by the host, not by hand)")
			return 2
		}
		if err := catalog.Serve(rest[0]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "proxy-config":
		return proxyConfig(rest)
	case "explain":
		return explain(rest)
	case "create-remote-secret":
		return createRemoteSecret(rest)
	case "version":
		fmt.Println(Version)
		return 0
	case "-h", "-help", "--help", "help":
		usage()
		return 0
	}
	fmt.Fprintf(os.Stderr, "estuary: unknown command %q\n", cmd)
	usage()
	return 2
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: estuary COMMAND [flags]

commands:
  run -config FILE         run the control plane
  validate -config FILE    check a configuration without starting anything
  plugins [-config FILE]   list bundled and configured plugins
  proxy-config endpoints --node ID [--cluster NAME] [--admin ADDR]
                           show the endpoints a connected node receives
  proxy-config clusters --node ID [--cluster NAME] [--admin ADDR]
                           show each cluster's TLS and SNI, and why
  explain endpoint --node ID --cluster 'outbound|PORT||HOST' [--admin ADDR]
  explain service HOST --node ID [--admin ADDR]
                           why a node gets those endpoints: network rules,
                           gateways, weights
                           (both take --admin-token-file, --admin-ca-file,
                           --admin-cert-file and --admin-key-file for an
                           admin server with token_file or tls)
  create-remote-secret --name CLUSTER_ID [--kubeconfig FILE] [--context CTX]
                       [--namespace NS] [--server URL] [--service-account SA]
                           prepare a member cluster (service account, read-only
                           role, token) and print its remote secret, to apply
                           in the primary clusters
  version                  print the version
`)
}
