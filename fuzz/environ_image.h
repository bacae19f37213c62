// An environment image as /proc/PID/environ holds one (NAME=value strings,
// each ended by a NUL; the last NUL optional) made into a null-terminated
// char* array: the input of the configuration fuzz targets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct EnvironImage {
  EnvironImage(const uint8_t* data, size_t size) {
    std::string cur;
    for (size_t i = 0; i < size; ++i) {
      if (data[i] == '\0') {
        vars.push_back(std::move(cur));
        cur.clear();
      } else {
        cur += static_cast<char>(data[i]);
      }
    }
    if (!cur.empty()) vars.push_back(std::move(cur));
    for (std::string& v : vars) env.push_back(v.data());
    env.push_back(nullptr);
  }
  EnvironImage(const EnvironImage&) = delete;
  EnvironImage& operator=(const EnvironImage&) = delete;

  std::vector<std::string> vars;
  std::vector<char*> env;  // into `vars`, null-terminated
};
