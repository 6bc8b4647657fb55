package kubernetes

import "errors"

// ErrKubeconfigRejected is wrapped by every error about a remote secret's
// kubeconfig that the plugin refuses to use.
var ErrKubeconfigRejected = errors.New("kubeconfig rejected")
