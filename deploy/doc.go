// Package deploy holds no code: it is the home of the tests of what an
// operator deploys, the image (Dockerfile, `make image`) and the Helm chart
// (helm/estuary), run against the real helm CLI, the real image and a real
// API server. See helm/estuary/README.md.
package deploy
