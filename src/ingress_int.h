/*
 * Former name of consumer_int.h, the durable consumer's private interface:
 * kept only so that the files which still include it by this name
 * (deadletter.c, envelope.c, publisher.c, fuzz/fuzz_envelope.c) build
 * unchanged. Include consumer_int.h instead; this header goes once they do.
 */
#include "consumer_int.h" /* IWYU pragma: export */
