# Shortcuts for the scripts (they install what is missing first).
.PHONY: demo test soak
demo:
	./scripts/demo
test:
	./scripts/test
soak:
	./scripts/soak $(SOAK_ARGS)
