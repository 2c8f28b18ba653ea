/* The AMX tile configuration (palette 1) shared by the AMX kernels (matmul_amx.c,
 * kv_attend_amx.c): a kernel sets the rows and row bytes of the tiles it uses, loads the
 * configuration at the start of its call and releases the tiles at its end, so that kernels of
 * different tile shapes can follow each other on a thread. Include only from files compiled
 * with AMX (named *_amx.c). */
#ifndef CI_BACKEND_CPU_AMX_TILES_H
#define CI_BACKEND_CPU_AMX_TILES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The LDTILECFG operand: 64 bytes. */
typedef struct {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
} ci_amx_tile_config;

/* A palette-1 configuration with no tile set. */
static inline ci_amx_tile_config ci_amx_config_empty(void) {
  ci_amx_tile_config config;
  memset(&config, 0, sizeof config);
  config.palette = 1;
  return config;
}

static inline void ci_amx_config_set(ci_amx_tile_config *config, int tile, int rows, int bytes) {
  config->rows[tile] = (uint8_t)rows;
  config->bytes_per_row[tile] = (uint16_t)bytes;
}

static inline void ci_amx_load_config(const ci_amx_tile_config *config) {
  /* gcc's _tile_loadconfig tells the compiler it reads 8 bytes of the config; the barrier keeps
   * the stores of the other fields from being dropped as dead */
  __asm__ volatile("" : : "m"(*config) : "memory");
  _tile_loadconfig(config);
}

#endif
