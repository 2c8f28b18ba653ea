/* A word-level test vocabulary holding Gemma 4's channel and tool-call markers as special added
 * tokens (the bundled starter model has none), shared by the parser and server-pipeline tests. */
#ifndef CI_TEST_GEMMA_MARKERS_TOKENIZER_H
#define CI_TEST_GEMMA_MARKERS_TOKENIZER_H

enum {
  T_THOUGHT = 1,
  T_NL,
  T_I,
  T_THINK,
  T_HELLO,
  T_WORLD,
  T_CALL,
  T_WEATHER,
  T_LBRACE,
  T_RBRACE,
  T_CITY,
  T_PARIS,
  T_COMMA,
  T_DAYS,
  T_3,
  T_CH_OPEN = 20,
  T_CH_CLOSE,
  T_CALL_OPEN,
  T_CALL_CLOSE,
  T_QUOTE,
  T_RESPONSE
};

/* Its tokenizer.json. */
static const char gemma_markers_tokenizer_json[] =
    "{\"model\": {\"type\": \"WordLevel\", \"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0, "
    "\"thought\": 1, \"\\n\": 2, \"I\": 3, \" think\": 4, \"Hello\": 5, \" world\": 6, "
    "\"call:\": 7, \"get_weather\": 8, \"{\": 9, \"}\": 10, \"city:\": 11, \"Paris\": 12, "
    "\",\": 13, \"days:\": 14, \"3\": 15, \"<|channel>\": 20, \"<channel|>\": 21, "
    "\"<|tool_call>\": 22, \"<tool_call|>\": 23, \"<|\\\"|>\": 24, \"<|tool_response>\": 25}}, "
    "\"decoder\": {\"type\": \"Fuse\"}, \"added_tokens\": ["
    "{\"id\": 20, \"content\": \"<|channel>\", \"special\": true},"
    "{\"id\": 21, \"content\": \"<channel|>\", \"special\": true},"
    "{\"id\": 22, \"content\": \"<|tool_call>\", \"special\": true},"
    "{\"id\": 23, \"content\": \"<tool_call|>\", \"special\": true},"
    "{\"id\": 24, \"content\": \"<|\\\"|>\", \"special\": true},"
    "{\"id\": 25, \"content\": \"<|tool_response>\", \"special\": true}]}";

#endif
