// Package deploy holds no code: its tests check turnout's deployment
// artifacts with the real tools. The Helm chart (helm/turnout) is linted
// (helm lint --strict against values.schema.json, which must refuse typos)
// and rendered by helm for each values profile (helm/turnout/ci), each
// rendered config passes `turnout check -`, every
// rendered object is applied with a server-side dry run to a real
// kube-apiserver in a namespace enforcing restricted Pod Security, the
// plain manifests (kubernetes/) must equal the chart's rendering, and the
// alert rules pass promtool's checks and unit tests.
package deploy
