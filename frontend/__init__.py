from mqttcore import compiled

compiled.check(__file__)
