module lockstep.dev/hack/gomod/lws

go 1.26

require sigs.k8s.io/lws v0.7.0 // indirect
